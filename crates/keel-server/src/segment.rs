//! `keel segment dump FILE`: what a segment file holds, byte position by
//! byte position, for Keel's files and Apache Kafka's (`.log`, `.index`,
//! `.timeindex`, `.txnindex`, picked by extension). The reading is
//! `keel_log::inspect`; this is its front end: files in, a table or JSON
//! lines out, an exit status scripts can test (see [`EXIT_STATUS`]).
//! `docs/segment-dump.md` says how to read the output.

use std::fmt::Write as _;
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use keel_log::codec::Codec;
use keel_log::inspect::{
    self, base_offset_from_name, control_type_name, BatchSpan, CorruptRegion, Found, FoundBatch,
    IndexEntries, IndexMismatch, RecordView,
};
use serde_json::{json, Value};

pub const EXIT_STATUS: &str = "\
Exit status: 0 when everything read is sound; 1 when the dump found a problem \
(a corrupt region, a batch whose CRC does not verify, records that do not \
decode, a partial index entry, an index entry that disagrees with the log \
under --verify-index) or, with --position, when the byte is not inside a \
sound batch; 2 when the file cannot be read or the arguments are wrong.";

#[derive(clap::Args, Debug)]
pub struct SegmentArgs {
    #[command(subcommand)]
    pub command: SegmentCommand,
}

#[derive(clap::Subcommand, Debug)]
pub enum SegmentCommand {
    /// List what a segment file holds: the batches of a `.log` (with
    /// their byte positions, corrupt regions reported and skipped), or the
    /// entries of a `.index`, `.timeindex` or `.txnindex`. Keel's files
    /// and Apache Kafka's alike.
    #[command(after_help = EXIT_STATUS)]
    Dump(DumpArgs),
}

#[derive(clap::Args, Debug, Clone, Default)]
pub struct DumpArgs {
    /// A `.log`, `.index`, `.timeindex` or `.txnindex` file.
    pub file: PathBuf,
    /// Also list each batch's records (Kafka's --deep-iteration).
    #[arg(long, visible_alias = "deep-iteration")]
    pub records: bool,
    /// Also print keys, values and headers (implies --records; Kafka's
    /// --print-data-log).
    #[arg(long, visible_alias = "print-data-log")]
    pub print_data: bool,
    /// Only say what is at this byte of a `.log`: the batch holding it
    /// (and, with --records, the record), a corrupt region, or the end.
    #[arg(long, value_name = "BYTE")]
    pub position: Option<u64>,
    /// Check index entries against the `.log` beside the file (on a
    /// `.log`: against its `.index`, `.timeindex` and `.txnindex`) and
    /// list each mismatch.
    #[arg(long)]
    pub verify_index: bool,
    /// The segment's base offset, when the file name does not state it
    /// (default: the name's 20-digit stem).
    #[arg(long, value_name = "OFFSET")]
    pub base_offset: Option<i64>,
    /// Print JSON lines (one object per line, `type` first) instead of a
    /// table.
    #[arg(long)]
    pub json: bool,
}

/// Which file a dump reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Log,
    OffsetIndex,
    TimeIndex,
    TxnIndex,
}

impl Kind {
    fn of(path: &Path) -> Option<Kind> {
        Some(match path.extension()?.to_str()? {
            "log" => Kind::Log,
            "index" => Kind::OffsetIndex,
            "timeindex" => Kind::TimeIndex,
            "txnindex" => Kind::TxnIndex,
            _ => return None,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Kind::Log => "log",
            Kind::OffsetIndex => "index",
            Kind::TimeIndex => "timeindex",
            Kind::TxnIndex => "txnindex",
        }
    }
}

/// The bytes a dump reads: the file, and with --verify-index the files
/// beside it.
#[derive(Debug, Clone)]
pub struct Input {
    pub name: String,
    pub kind: Kind,
    pub data: Vec<u8>,
    pub base_offset: i64,
    pub log: Option<Vec<u8>>,
    pub offset_index: Option<Vec<u8>>,
    pub time_index: Option<Vec<u8>>,
    pub txn_index: Option<Vec<u8>>,
}

/// How a dump went, for the exit status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Outcome {
    /// Corrupt regions, bad CRCs, undecodable records, partial or bad
    /// index entries and index mismatches found.
    pub problems: u64,
    /// With --position: whether the byte is inside a sound batch.
    pub position_in_batch: Option<bool>,
}

impl Outcome {
    pub fn exit_code(&self) -> u8 {
        let bad = self.problems > 0 && self.position_in_batch.is_none();
        u8::from(bad || self.position_in_batch == Some(false))
    }
}

pub fn run(args: &SegmentArgs) -> Result<Outcome, String> {
    let SegmentCommand::Dump(args) = &args.command;
    let input = load(args)?;
    let stdout = io::stdout();
    let mut out = io::BufWriter::new(stdout.lock());
    let outcome = dump(&input, args, &mut out).and_then(|o| out.flush().map(|()| o));
    match outcome {
        Ok(o) => Ok(o),
        // `keel segment dump ... | head` is not an error.
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => Ok(Outcome::default()),
        Err(e) => Err(e.to_string()),
    }
}

/// Reads the file (and, for --verify-index, its siblings).
pub fn load(args: &DumpArgs) -> Result<Input, String> {
    let path = &args.file;
    let kind = Kind::of(path).ok_or_else(|| {
        format!(
            "{}: not a .log, .index, .timeindex or .txnindex file",
            path.display()
        )
    })?;
    let read = |p: &Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
    let read_if_there = |p: PathBuf| if p.exists() { read(&p).map(Some) } else { Ok(None) };
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let base_offset = match args.base_offset {
        Some(b) => b,
        None => base_offset_from_name(&name).ok_or_else(|| {
            format!("{name}: the name does not state the base offset (20 digits); pass --base-offset")
        })?,
    };
    if args.position.is_some() && kind != Kind::Log {
        return Err("--position reads a .log file".into());
    }
    let mut input = Input {
        name,
        kind,
        data: read(path)?,
        base_offset,
        log: None,
        offset_index: None,
        time_index: None,
        txn_index: None,
    };
    if args.verify_index {
        match kind {
            Kind::Log => {
                input.offset_index = read_if_there(path.with_extension("index"))?;
                input.time_index = read_if_there(path.with_extension("timeindex"))?;
                input.txn_index = read_if_there(path.with_extension("txnindex"))?;
                if input.offset_index.is_none() && input.time_index.is_none() && input.txn_index.is_none() {
                    return Err(format!(
                        "{}: no .index, .timeindex or .txnindex beside it",
                        path.display()
                    ));
                }
            }
            Kind::OffsetIndex | Kind::TimeIndex | Kind::TxnIndex => {
                input.log = Some(read(&path.with_extension("log"))?)
            }
        }
    }
    Ok(input)
}

/// Writes the dump of `input` to `out`.
pub fn dump(input: &Input, args: &DumpArgs, out: &mut dyn Write) -> io::Result<Outcome> {
    let mut dumper = Dumper {
        out,
        json: args.json,
        records: args.records || args.print_data,
        data: args.print_data,
        outcome: Outcome::default(),
        summary: Summary::default(),
    };
    dumper.segment_line(input)?;
    match input.kind {
        Kind::Log => match args.position {
            Some(p) => dumper.position(&input.data, p)?,
            None => {
                let batches = dumper.log(&input.data)?;
                if let Some(index) = &input.offset_index {
                    dumper.offset_index(index, input.base_offset, Some(&batches))?;
                }
                if let Some(index) = &input.time_index {
                    dumper.time_index(index, input.base_offset, Some(&batches))?;
                }
                if let Some(index) = &input.txn_index {
                    dumper.txn_index(index, Some(&batches))?;
                }
            }
        },
        Kind::OffsetIndex | Kind::TimeIndex => {
            let batches = input.log.as_deref().map(log_spans);
            if input.kind == Kind::OffsetIndex {
                dumper.offset_index(&input.data, input.base_offset, batches.as_deref())?;
            } else {
                dumper.time_index(&input.data, input.base_offset, batches.as_deref())?;
            }
        }
        Kind::TxnIndex => {
            let batches = input.log.as_deref().map(log_spans);
            dumper.txn_index(&input.data, batches.as_deref())?
        }
    }
    if args.position.is_none() {
        dumper.summary_line()?;
    }
    Ok(dumper.outcome)
}

/// The spans of the batches of a `.log` whose framing holds.
fn log_spans(data: &[u8]) -> Vec<BatchSpan> {
    inspect::walk(data)
        .filter_map(|f| match f {
            Found::Batch(b, bytes) => Some(BatchSpan::new(&b, bytes)),
            Found::Corrupt(_) => None,
        })
        .collect()
}

#[derive(Debug, Default)]
struct Summary {
    batches: u64,
    records: u64,
    bad_crc: u64,
    corrupt_regions: u64,
    corrupt_bytes: u64,
    record_errors: u64,
    entries: u64,
    ignored_entries: u64,
    mismatches: u64,
}

struct Dumper<'a> {
    out: &'a mut dyn Write,
    json: bool,
    records: bool,
    data: bool,
    outcome: Outcome,
    summary: Summary,
}

/// The batch table's header line, in [`batch_row`]'s widths.
fn batch_columns() -> String {
    format!(
        "{:>10}  {:>8}  {:>12}  {:>12}  {:>5}  {:>6}  {:>5}  {:>10}  {:<6}  {:<6}  {:<7}  {:<3}  {:<4}  \
         {:>19}  {:>19}  {:>8}  {:>7}  {:>8}",
        "POSITION",
        "LENGTH",
        "BASE_OFFSET",
        "LAST_OFFSET",
        "COUNT",
        "EPOCH",
        "MAGIC",
        "CRC",
        "CRC_OK",
        "CODEC",
        "TS_TYPE",
        "TXN",
        "CTRL",
        "FIRST_TIMESTAMP",
        "MAX_TIMESTAMP",
        "PRODUCER",
        "P_EPOCH",
        "BASE_SEQ",
    )
}

impl Dumper<'_> {
    fn emit(&mut self, value: Value, text: &str) -> io::Result<()> {
        if self.json {
            writeln!(self.out, "{value}")
        } else {
            writeln!(self.out, "{text}")
        }
    }

    fn segment_line(&mut self, input: &Input) -> io::Result<()> {
        let v = json!({"type": "segment", "file": input.name, "kind": input.kind.name(),
                       "bytes": input.data.len(), "base_offset": input.base_offset});
        let text = format!(
            "{}: {} file, {} bytes, base offset {}",
            input.name,
            input.kind.name(),
            input.data.len(),
            input.base_offset
        );
        self.emit(v, &text)
    }

    /// Every batch and corrupt region; returns the batches' spans.
    fn log(&mut self, data: &[u8]) -> io::Result<Vec<BatchSpan>> {
        let mut spans = Vec::new();
        if !self.json {
            writeln!(self.out, "{}", batch_columns())?;
        }
        for found in inspect::walk(data) {
            match found {
                Found::Batch(batch, bytes) => {
                    spans.push(BatchSpan::new(&batch, bytes));
                    self.batch(&batch, bytes, None)?;
                }
                Found::Corrupt(region) => self.corrupt(&region)?,
            }
        }
        Ok(spans)
    }

    fn batch(&mut self, batch: &FoundBatch, bytes: &[u8], only_at: Option<u64>) -> io::Result<()> {
        self.summary.batches += 1;
        if !batch.crc_valid() {
            self.summary.bad_crc += 1;
            self.outcome.problems += 1;
        }
        let mut v = batch_json(batch);
        let mut text = batch_row(batch);
        if self.records {
            let mut listed = Vec::new();
            let data = self.data;
            let result = inspect::visit_records(bytes, &batch.header, batch.position, |r| {
                let wanted = match (only_at, r.position) {
                    (None, _) => true,
                    (Some(p), Some((at, len))) => (at..at + len).contains(&p),
                    // A compressed batch's records have no file position.
                    (Some(_), None) => false,
                };
                if wanted {
                    listed.push((record_json(&r, data), record_line(&r, data)));
                }
            });
            self.summary.records += listed.len() as u64;
            let (json_records, lines): (Vec<Value>, Vec<String>) = listed.into_iter().unzip();
            v["records"] = Value::Array(json_records);
            for line in lines {
                let _ = write!(text, "\n{line}");
            }
            if let Err(why) = result {
                self.summary.record_errors += 1;
                self.outcome.problems += 1;
                let _ = write!(text, "\n    | RECORDS ERROR: {why}");
                v["records_error"] = json!(why);
            }
        }
        self.emit(v, &text)
    }

    fn corrupt(&mut self, region: &CorruptRegion) -> io::Result<()> {
        self.summary.corrupt_regions += 1;
        self.summary.corrupt_bytes += region.length;
        self.outcome.problems += 1;
        let v = json!({"type": "corrupt", "position": region.position, "length": region.length,
                       "reason": region.reason});
        let text = format!(
            "{:>10}  {:>8}  CORRUPT: {}",
            region.position, region.length, region.reason
        );
        self.emit(v, &text)
    }

    /// What is at byte `p` of the `.log` image `data`.
    fn position(&mut self, data: &[u8], p: u64) -> io::Result<()> {
        for found in inspect::walk(data) {
            match found {
                Found::Batch(batch, bytes) if (batch.position..batch.end()).contains(&p) => {
                    let part = batch_part(&batch, p);
                    let sound = batch.crc_valid();
                    self.outcome.position_in_batch = Some(sound);
                    let v = json!({"type": "position", "position": p, "in": "batch", "part": part,
                                   "batch_position": batch.position, "crc_valid": sound});
                    let text = format!(
                        "byte {p}: in the batch at position {} (offsets {}..={}), {part}{}",
                        batch.position,
                        batch.header.base_offset,
                        batch.header.last_offset(),
                        if sound { "" } else { "; its CRC does not verify" }
                    );
                    self.emit(v, &text)?;
                    if !self.json {
                        writeln!(self.out, "{}", batch_columns())?;
                    }
                    return self.batch(&batch, bytes, Some(p));
                }
                Found::Corrupt(region) if (region.position..region.position + region.length).contains(&p) => {
                    self.outcome.position_in_batch = Some(false);
                    let v = json!({"type": "position", "position": p, "in": "corrupt"});
                    self.emit(v, &format!("byte {p}: in a corrupt region"))?;
                    return self.corrupt(&region);
                }
                _ => {}
            }
        }
        self.outcome.position_in_batch = Some(false);
        let v = json!({"type": "position", "position": p, "in": "past_end", "bytes": data.len()});
        self.emit(
            v,
            &format!("byte {p}: past the end of the file ({} bytes)", data.len()),
        )
    }

    fn index_notes<T>(&mut self, entries: &IndexEntries<T>, what: &str) -> io::Result<()> {
        self.summary.entries += entries.entries.len() as u64;
        self.summary.ignored_entries += entries.ignored_entries as u64;
        if entries.ignored_entries > 0 {
            let zero = entries.ignored_all_zero;
            let v = json!({"type": "ignored_entries", "index": what, "entries": entries.ignored_entries,
                           "all_zero": zero});
            let text = format!(
                "{} {what} entries after entry {} ignored: an entry with relative offset 0 after \
                 the first ends the index, as in Kafka ({})",
                entries.ignored_entries,
                entries.entries.len().saturating_sub(1),
                if zero {
                    "all zero: preallocated, not trimmed"
                } else {
                    "NOT all zero"
                }
            );
            self.emit(v, &text)?;
        }
        if entries.partial_bytes > 0 {
            self.outcome.problems += 1;
            let v = json!({"type": "partial_entry", "index": what, "bytes": entries.partial_bytes});
            self.emit(
                v,
                &format!("{} bytes at the end are not a whole entry", entries.partial_bytes),
            )?;
        }
        Ok(())
    }

    fn mismatches(&mut self, found: Vec<IndexMismatch>, what: &str) -> io::Result<()> {
        for m in found {
            self.summary.mismatches += 1;
            self.outcome.problems += 1;
            let v = json!({"type": "mismatch", "index": what, "entry": m.entry, "reason": m.reason});
            self.emit(v, &format!("MISMATCH {what} entry {}: {}", m.entry, m.reason))?;
        }
        Ok(())
    }

    fn offset_index(&mut self, bytes: &[u8], base: i64, batches: Option<&[BatchSpan]>) -> io::Result<()> {
        let entries = inspect::read_offset_index(bytes);
        if !self.json {
            writeln!(
                self.out,
                "offset index: {} entries\n   ENTRY        OFFSET    POSITION",
                entries.entries.len()
            )?;
        }
        for (i, &(relative, position)) in entries.entries.iter().enumerate() {
            let offset = base.saturating_add(i64::from(relative));
            let v = json!({"type": "offset_index_entry", "entry": i, "offset": offset,
                           "relative_offset": relative, "position": position});
            self.emit(v, &format!("{i:>8}  {offset:>12}  {position:>10}"))?;
        }
        self.index_notes(&entries, "offset")?;
        if let Some(batches) = batches {
            self.mismatches(
                inspect::verify_offset_index(&entries.entries, base, batches),
                "offset",
            )?;
        }
        Ok(())
    }

    fn time_index(&mut self, bytes: &[u8], base: i64, batches: Option<&[BatchSpan]>) -> io::Result<()> {
        let entries = inspect::read_time_index(bytes);
        if !self.json {
            writeln!(
                self.out,
                "time index: {} entries\n   ENTRY             TIMESTAMP        OFFSET",
                entries.entries.len()
            )?;
        }
        for (i, &(timestamp, relative)) in entries.entries.iter().enumerate() {
            let offset = base.saturating_add(i64::from(relative));
            let v = json!({"type": "time_index_entry", "entry": i, "timestamp": timestamp,
                           "offset": offset, "relative_offset": relative});
            self.emit(v, &format!("{i:>8}  {timestamp:>20}  {offset:>12}"))?;
        }
        self.index_notes(&entries, "time")?;
        if let Some(batches) = batches {
            self.mismatches(
                inspect::verify_time_index(&entries.entries, base, batches),
                "time",
            )?;
        }
        Ok(())
    }

    fn txn_index(&mut self, bytes: &[u8], batches: Option<&[BatchSpan]>) -> io::Result<()> {
        let (entries, partial) = inspect::read_txn_index(bytes);
        if !self.json {
            writeln!(
                self.out,
                "   ENTRY  PRODUCER_ID  FIRST_OFFSET   LAST_OFFSET  LAST_STABLE_OFFSET"
            )?;
        }
        for (i, entry) in entries.iter().enumerate() {
            self.summary.entries += 1;
            match entry {
                Ok(t) => {
                    let v = json!({"type": "txn_index_entry", "entry": i, "producer_id": t.producer_id,
                                   "first_offset": t.first_offset, "last_offset": t.last_offset,
                                   "last_stable_offset": t.last_stable_offset});
                    let text = format!(
                        "{i:>8}  {:>11}  {:>12}  {:>12}  {:>18}",
                        t.producer_id, t.first_offset, t.last_offset, t.last_stable_offset
                    );
                    self.emit(v, &text)?;
                }
                Err(why) => {
                    self.outcome.problems += 1;
                    let v = json!({"type": "txn_index_entry", "entry": i, "error": why});
                    self.emit(v, &format!("{i:>8}  BAD ENTRY: {why}"))?;
                }
            }
        }
        if partial > 0 {
            // Kafka ignores a partial last entry (a torn write); so does Keel.
            let v = json!({"type": "partial_entry", "index": "txn", "bytes": partial});
            self.emit(
                v,
                &format!("{partial} bytes at the end are not a whole entry (ignored)"),
            )?;
        }
        if let Some(batches) = batches {
            self.mismatches(inspect::verify_txn_index(&entries, batches), "txn")?;
        }
        Ok(())
    }

    fn summary_line(&mut self) -> io::Result<()> {
        let s = &self.summary;
        let v = json!({"type": "summary", "batches": s.batches, "records": s.records,
                       "bad_crc": s.bad_crc, "corrupt_regions": s.corrupt_regions,
                       "corrupt_bytes": s.corrupt_bytes, "record_errors": s.record_errors,
                       "index_entries": s.entries, "ignored_entries": s.ignored_entries,
                       "mismatches": s.mismatches, "problems": self.outcome.problems});
        let text = format!(
            "summary: {} batches ({} records listed), {} with a bad CRC, {} corrupt regions ({} bytes), \
             {} record errors, {} index entries ({} ignored), {} mismatches: {}",
            s.batches,
            s.records,
            s.bad_crc,
            s.corrupt_regions,
            s.corrupt_bytes,
            s.record_errors,
            s.entries,
            s.ignored_entries,
            s.mismatches,
            if self.outcome.problems == 0 {
                "OK"
            } else {
                "PROBLEMS FOUND"
            }
        );
        self.emit(v, &text)
    }
}

/// Which part of `batch` byte `p` is in.
fn batch_part(batch: &FoundBatch, p: u64) -> &'static str {
    match p - batch.position {
        0..=7 => "baseOffset field",
        8..=11 => "batchLength field",
        12..=60 => "header",
        _ if batch.header.compression_codec() != 0 => "compressed records",
        _ => "records",
    }
}

fn codec_name(id: u8) -> String {
    Codec::from_id(id).map_or_else(|| format!("codec{id}"), |c| c.name().to_string())
}

fn timestamp_type(batch: &FoundBatch) -> &'static str {
    if batch.header.timestamp_type_is_log_append() {
        "append"
    } else {
        "create"
    }
}

fn batch_json(batch: &FoundBatch) -> Value {
    let h = &batch.header;
    let mut v = json!({
        "type": "batch", "position": batch.position, "length": batch.len(),
        "base_offset": h.base_offset, "last_offset": h.last_offset(),
        "partition_leader_epoch": h.partition_leader_epoch, "magic": h.magic,
        "crc": h.crc, "computed_crc": batch.computed_crc, "crc_valid": batch.crc_valid(),
        "attributes": h.attributes, "codec": codec_name(h.compression_codec()),
        "timestamp_type": timestamp_type(batch), "transactional": h.is_transactional(),
        "control": h.is_control(), "first_timestamp": h.base_timestamp,
        "max_timestamp": h.max_timestamp, "producer_id": h.producer_id,
        "producer_epoch": h.producer_epoch, "base_sequence": h.base_sequence,
        "last_sequence": h.last_sequence(), "records_count": h.records_count,
    });
    if let Some(horizon) = keel_log::records::delete_horizon(h) {
        v["delete_horizon"] = json!(horizon);
    }
    v
}

fn yes(flag: bool) -> &'static str {
    if flag {
        "yes"
    } else {
        "-"
    }
}

fn batch_row(batch: &FoundBatch) -> String {
    let h = &batch.header;
    format!(
        "{:>10}  {:>8}  {:>12}  {:>12}  {:>5}  {:>6}  {:>5}  {:>10}  {:<6}  {:<6}  {:<7}  {:<3}  {:<4}  \
         {:>19}  {:>19}  {:>8}  {:>7}  {:>8}",
        batch.position,
        batch.len(),
        h.base_offset,
        h.last_offset(),
        h.records_count,
        h.partition_leader_epoch,
        h.magic,
        h.crc,
        if batch.crc_valid() { "yes" } else { "NO" },
        codec_name(h.compression_codec()),
        timestamp_type(batch),
        yes(h.is_transactional()),
        yes(h.is_control()),
        h.base_timestamp,
        h.max_timestamp,
        h.producer_id,
        h.producer_epoch,
        h.base_sequence,
    )
}

fn size(field: Option<&[u8]>) -> i64 {
    field.map_or(-1, |f| f.len() as i64)
}

/// Bytes as JSON: a string when they are UTF-8, else `{"hex": "..."}`.
fn bytes_json(field: Option<&[u8]>) -> Value {
    match field {
        None => Value::Null,
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => json!(s),
            Err(_) => json!({ "hex": hex(b) }),
        },
    }
}

/// Bytes for the table: quoted text when UTF-8, else `0x` and hex.
fn bytes_text(field: Option<&[u8]>) -> String {
    match field {
        None => "null".into(),
        Some(b) => match std::str::from_utf8(b) {
            Ok(s) => format!("{s:?}"),
            Err(_) => format!("0x{}", hex(b)),
        },
    }
}

fn hex(b: &[u8]) -> String {
    b.iter().fold(String::with_capacity(b.len() * 2), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

fn control_json(r: &RecordView<'_>) -> Value {
    match r.control_type {
        Some(t) => json!(control_type_name(t)),
        None => Value::Null,
    }
}

fn record_json(r: &RecordView<'_>, data: bool) -> Value {
    let mut v = json!({"offset": r.offset, "timestamp": r.timestamp, "key_size": size(r.key),
                       "value_size": size(r.value), "headers": r.headers.len()});
    if let Some((at, len)) = r.position {
        v["position"] = json!(at);
        v["size"] = json!(len);
    }
    if r.control_type.is_some() {
        v["control_type"] = control_json(r);
    }
    if data {
        v["key"] = bytes_json(r.key);
        v["value"] = bytes_json(r.value);
        v["header_data"] = r
            .headers
            .iter()
            .map(|(k, hv)| json!({"key": String::from_utf8_lossy(k), "value": bytes_json(*hv)}))
            .collect();
    }
    v
}

fn record_line(r: &RecordView<'_>, data: bool) -> String {
    let mut line = format!(
        "    | offset {}  timestamp {}  key {}  value {}  headers {}",
        r.offset,
        r.timestamp,
        size(r.key),
        size(r.value),
        r.headers.len()
    );
    if let Some((at, len)) = r.position {
        let _ = write!(line, "  at {at} ({len} bytes)");
    }
    if let Some(t) = r.control_type {
        let _ = write!(line, "  control {}", control_type_name(t));
    }
    if data {
        let _ = write!(
            line,
            "  key: {}  value: {}",
            bytes_text(r.key),
            bytes_text(r.value)
        );
        for (k, v) in &r.headers {
            let _ = write!(line, "  header {}={}", String::from_utf8_lossy(k), bytes_text(*v));
        }
    }
    line
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    fn kafka_fixture(suffix: &str) -> Vec<u8> {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/kafka-segment");
        std::fs::read(dir.join(format!("00000000000000000000.{suffix}"))).expect("fixture")
    }

    fn input(kind: Kind, data: Vec<u8>) -> Input {
        Input {
            name: format!("00000000000000000000.{}", kind.name()),
            kind,
            data,
            base_offset: 0,
            log: None,
            offset_index: None,
            time_index: None,
            txn_index: None,
        }
    }

    /// Damaged copies of Kafka's segment and its indexes, dumped with every
    /// option, never panic; the JSON stays one valid object per line, and
    /// a damaged `.log` is never reported sound unless it still holds
    /// exactly sound batches.
    #[test]
    fn random_damage_never_panics() {
        // Printed; KEEL_TEST_SEED replays it.
        let seed = keel_log::testing::test_seed();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(seed);
        let files = [
            (Kind::Log, kafka_fixture("log")),
            (Kind::OffsetIndex, kafka_fixture("index")),
            (Kind::TimeIndex, kafka_fixture("timeindex")),
            (Kind::TxnIndex, kafka_fixture("txnindex")),
        ];
        let log = files[0].1.clone();
        for round in 0..400 {
            let (kind, original) = &files[rng.gen_range(0..files.len())];
            let mut data = original.clone();
            for _ in 0..rng.gen_range(1..4) {
                match rng.gen_range(0..3) {
                    0 if !data.is_empty() => {
                        let at = rng.gen_range(0..data.len());
                        data[at] = rng.gen();
                    }
                    1 => data.truncate(rng.gen_range(0..=data.len())),
                    _ => {
                        let at = rng.gen_range(0..=data.len());
                        let junk: Vec<u8> = (0..rng.gen_range(1..64)).map(|_| rng.gen()).collect();
                        data.splice(at..at, junk);
                    }
                }
            }
            let mut inp = input(*kind, data);
            let mut log_copy = log.clone();
            if !log_copy.is_empty() && rng.gen_bool(0.5) {
                let at = rng.gen_range(0..log_copy.len());
                log_copy[at] ^= 0x20;
            }
            let mut args = DumpArgs {
                records: rng.gen_bool(0.5),
                print_data: rng.gen_bool(0.3),
                json: rng.gen_bool(0.5),
                verify_index: true,
                ..DumpArgs::default()
            };
            match kind {
                Kind::Log => {
                    inp.offset_index = Some(kafka_fixture("index"));
                    inp.time_index = Some(kafka_fixture("timeindex"));
                    inp.txn_index = Some(kafka_fixture("txnindex"));
                    if rng.gen_bool(0.3) {
                        args.position = Some(rng.gen_range(0..inp.data.len() as u64 + 10));
                    }
                }
                Kind::OffsetIndex | Kind::TimeIndex | Kind::TxnIndex => inp.log = Some(log_copy),
            }
            let mut out = Vec::new();
            let outcome = dump(&inp, &args, &mut out).expect("writes to a Vec");
            let text = String::from_utf8(out).expect("utf-8");
            if args.json {
                for line in text.lines() {
                    let v: Value = serde_json::from_str(line)
                        .unwrap_or_else(|e| panic!("seed {seed} round {round}: {e}: {line}"));
                    assert!(v["type"].is_string(), "seed {seed} round {round}: {line}");
                }
            }
            if *kind == Kind::Log && args.position.is_none() && outcome.problems == 0 {
                let sound =
                    inspect::walk(&inp.data).all(|f| matches!(f, Found::Batch(b, _) if b.crc_valid()));
                assert!(sound, "seed {seed} round {round}: damage reported as sound");
            }
        }
    }
}
