//! Producer ids and transactions.
//!
//! One function per API: its ACL checks (`handlers::authz`), its handler,
//! the denials merged into the answer, its quota accounting, the answer.

use super::*;

pub(super) async fn init_producer_id(b: &Arc<Broker>, r: InitProducerIdRequest, call: Call<'_>) -> Reply {
    let mut resp = match handlers::authz::init_producer_id(b, call.client, &r) {
        Some(error) => keel_protocol::messages::InitProducerIdResponse::default()
            .with_error_code(error.code())
            .with_producer_id(keel_protocol::messages::ProducerId(-1))
            .with_producer_epoch(-1),
        None => handlers::produce::init_producer_id(b, r).await,
    };
    call.answer(b, ApiKey::InitProducerId, &mut resp)
}

pub(super) async fn add_partitions_to_txn(
    b: &Arc<Broker>,
    r: AddPartitionsToTxnRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = match handlers::authz::add_partitions_to_txn(b, call.client, &r, call.version) {
        Some(refused) => refused,
        None => handlers::txn::add_partitions_to_txn(b, r, call.version).await,
    };
    call.answer(b, ApiKey::AddPartitionsToTxn, &mut resp)
}

pub(super) async fn end_txn(b: &Arc<Broker>, r: EndTxnRequest, call: Call<'_>) -> Reply {
    let mut resp = match handlers::authz::end_txn(b, call.client, &r) {
        Some(refused) => refused,
        None => handlers::txn::end_txn(b, r, call.version).await,
    };
    call.answer(b, ApiKey::EndTxn, &mut resp)
}

pub(super) async fn add_offsets_to_txn(b: &Arc<Broker>, r: AddOffsetsToTxnRequest, call: Call<'_>) -> Reply {
    let mut resp = match handlers::authz::add_offsets_to_txn(b, call.client, &r) {
        Some(error) => {
            keel_protocol::messages::AddOffsetsToTxnResponse::default().with_error_code(error.code())
        }
        None => handlers::txn::add_offsets_to_txn(b, r, call.version).await,
    };
    call.answer(b, ApiKey::AddOffsetsToTxn, &mut resp)
}

pub(super) async fn txn_offset_commit(
    b: &Arc<Broker>,
    mut r: TxnOffsetCommitRequest,
    call: Call<'_>,
) -> Reply {
    let mut resp = match handlers::authz::txn_offset_commit(b, call.client, &mut r) {
        Err(refused) => refused,
        Ok(denied) => {
            let mut resp = handlers::groups::txn_offset_commit(b, r, call.version).await;
            resp.topics.extend(denied);
            resp
        }
    };
    call.answer(b, ApiKey::TxnOffsetCommit, &mut resp)
}

pub(super) async fn write_txn_markers(b: &Arc<Broker>, r: WriteTxnMarkersRequest, call: Call<'_>) -> Reply {
    let resp = match handlers::authz::write_txn_markers(b, call.client, &r) {
        Some(refused) => refused,
        None => handlers::txn_admin::write_txn_markers(b, r).await,
    };
    respond(ApiKey::WriteTxnMarkers, call.version, call.id, &resp)
}

pub(super) async fn describe_transactions(
    b: &Arc<Broker>,
    mut r: DescribeTransactionsRequest,
    call: Call<'_>,
) -> Reply {
    let denied = handlers::authz::describe_transactions(b, call.client, &mut r);
    let mut resp = handlers::txn_admin::describe_transactions(b, r);
    handlers::authz::describe_transactions_topics(b, call.client, &mut resp);
    resp.transaction_states.extend(denied);
    call.answer(b, ApiKey::DescribeTransactions, &mut resp)
}

pub(super) async fn list_transactions(b: &Arc<Broker>, r: ListTransactionsRequest, call: Call<'_>) -> Reply {
    let mut resp = handlers::txn_admin::list_transactions(b, r);
    handlers::authz::list_transactions(b, call.client, &mut resp);
    call.answer(b, ApiKey::ListTransactions, &mut resp)
}

pub(super) async fn describe_producers(
    b: &Arc<Broker>,
    mut r: DescribeProducersRequest,
    call: Call<'_>,
) -> Reply {
    let denied = handlers::authz::describe_producers(b, call.client, &mut r);
    let mut resp = handlers::txn_admin::describe_producers(b, r);
    resp.topics.extend(denied);
    call.answer(b, ApiKey::DescribeProducers, &mut resp)
}
