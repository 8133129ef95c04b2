//! A cairn application that is *not* the `cairn` binary, for the tests of a cluster that
//! mixes binaries (`tests/app_refusals.rs`): it registers a `wordcount` whose graph differs
//! from the built-in one (an extra operator) and a job `only-here` that `cairn` lacks, and no
//! `nexmark`. A coordinator must refuse to deploy onto its workers what they cannot run
//! exactly like the coordinator, and refuse at submit a job it does not have.

use std::path::PathBuf;
use std::process::ExitCode;

use cairn::api::{JobGraph, StreamEnv};
use cairn::connectors::{DiscardSink, GeneratorSource};
use cairn_app::{App, Job, JobContext};
use serde::{Deserialize, Serialize};

/// Accepts the built-in wordcount's generated-input parameters (and ignores the others).
#[derive(clap::Args, Serialize, Deserialize, Debug, Default)]
#[serde(default)]
struct Loose {
    /// Words to generate.
    #[arg(long)]
    generate: Option<u64>,
    /// Distinct words.
    #[arg(long)]
    keys: Option<u64>,
    /// Ignored: the output is discarded.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Discard the output.
    #[arg(long)]
    discard: bool,
}

/// Generated words, an extra `upper` operator, discarded.
fn graph(name: &str, p: &Loose) -> Result<JobGraph, String> {
    let env = StreamEnv::new();
    env.source(GeneratorSource::new(
        p.generate.unwrap_or(1000),
        p.keys.unwrap_or(1000),
    ))
    .uid("source")
    .map(|w: cairn::connectors::Word| cairn::connectors::Word::from(w.to_uppercase()))
    .uid("upper")
    .sink(DiscardSink)
    .uid("sink");
    env.build(name)
}

/// A `wordcount` that builds another graph than the built-in one.
struct OtherWordcount;

impl Job for OtherWordcount {
    type Params = Loose;
    fn name(&self) -> &str {
        "wordcount"
    }
    fn build(&self, p: &Loose, _: &JobContext) -> Result<JobGraph, String> {
        graph("wordcount", p)
    }
}

/// A job only this binary has.
struct OnlyHere;

impl Job for OnlyHere {
    type Params = Loose;
    fn name(&self) -> &str {
        "only-here"
    }
    fn build(&self, p: &Loose, _: &JobContext) -> Result<JobGraph, String> {
        graph("only-here", p)
    }
}

fn main() -> ExitCode {
    App::new("mismatched")
        .job(OtherWordcount)
        .job(OnlyHere)
        .run()
}
