//! `keel`: the Keel broker and its tools.

mod admin;
mod compaction;
mod config;
mod connection;
mod doctor;
mod loggers;
mod peers;
mod receive_time;
mod segment;
mod server;
mod stats;
mod tls;

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use keel_protocol::alloc_guard::GuardedAlloc;

/// Hostile array lengths in requests must not abort the broker.
#[global_allocator]
static ALLOC: GuardedAlloc = GuardedAlloc;

#[derive(Parser)]
#[command(name = "keel", version, about = "Keel: a Kafka-compatible streaming broker")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run the broker.
    Serve(config::ServeArgs),
    /// Print a running broker's tail cache and read counters (from its
    /// admin endpoint).
    Stats(stats::StatsArgs),
    /// Plan compaction: passes, I/O, time and disk for a compacted topic.
    Compaction(compaction::CompactionArgs),
    /// Read segment files (`.log`, `.index`, `.timeindex`, `.txnindex`),
    /// Keel's or Apache Kafka's: batches by byte position, damage, index
    /// checks.
    Segment(segment::SegmentArgs),
    /// Check the host for what hurts a broker: memory limits, reclaim,
    /// kernel settings, each data dir's filesystem and disk.
    Doctor(doctor::DoctorArgs),
}

fn main() -> ExitCode {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // KEEL_LOG's levels, changeable at run time (BROKER_LOGGER).
    tracing_subscriber::registry()
        .with(loggers::filter())
        .with(loggers::Targets)
        .with(
            tracing_subscriber::fmt::layer()
                .with_ansi(ansi)
                .with_writer(std::io::stderr),
        )
        .init();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => match server::serve(args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("keel: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Compaction(args) => match compaction::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("keel compaction: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Segment(args) => match segment::run(&args) {
            Ok(outcome) => ExitCode::from(outcome.exit_code()),
            Err(e) => {
                eprintln!("keel segment: {e}");
                ExitCode::from(2)
            }
        },
        Command::Doctor(args) => match doctor::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("keel doctor: {e}");
                ExitCode::FAILURE
            }
        },
        Command::Stats(args) => match stats::run(&args) {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("keel stats: {e}");
                ExitCode::FAILURE
            }
        },
    }
}
