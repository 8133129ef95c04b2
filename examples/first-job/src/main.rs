use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;

use cairn::TaskResult;
use cairn::api::{Collector, JobGraph, KeyedProcessFunction, StreamEnv};
use cairn::connectors::{Encoder, FileSink, PrintSink, SequenceSource};
use cairn::state::{KeyedContext, ValueState};
use cairn_app::{App, Job, JobContext};
use serde::{Deserialize, Serialize};

/// The job's parameters: its flags on `myapp run click-count` and `myapp submit click-count`,
/// and the JSON the coordinator sends every worker.
#[derive(clap::Args, Serialize, Deserialize, Debug, Default)]
#[serde(default, deny_unknown_fields)]
struct Params {
    /// How many clicks to generate [default: 10000].
    #[arg(long, value_name = "N")]
    clicks: Option<u64>,
    /// Generate at most N clicks per second; 0: as fast as possible [default: 0].
    #[arg(long, value_name = "N")]
    rate: Option<u64>,
    /// Write the counts exactly once into this directory (default: print them).
    #[arg(long, value_name = "DIR")]
    output: Option<PathBuf>,
}

/// Click number `i` is by user `i mod 5`: a pure function of `i`, so a restored source
/// replays exactly the clicks it read before.
fn click(i: u64) -> String {
    format!("user{}", i % 5)
}

/// The running count of clicks per user, in keyed state: `process` sees the state of the
/// record's key only.
#[derive(Clone, Default)]
struct CountClicks {
    count: Option<ValueState<u64>>,
}

impl KeyedProcessFunction<String, String, (String, u64)> for CountClicks {
    /// Registers the state, in every subtask before its first record (after a restore, with
    /// the restored counts in it).
    fn open(&mut self, ctx: &mut KeyedContext<String>) -> TaskResult {
        self.count = Some(ctx.value_state("count")?);
        Ok(())
    }

    fn process(
        &mut self,
        user: String,
        ctx: &mut KeyedContext<String>,
        out: &mut Collector<(String, u64)>,
    ) -> TaskResult {
        if let Some(count) = &self.count {
            let n = count.get_mut(ctx, || 0)?;
            *n += 1;
            out.collect((user, *n));
        }
        Ok(())
    }
}

/// The job, registered in the app by its name.
struct ClickCount;

impl Job for ClickCount {
    type Params = Params;

    fn name(&self) -> &str {
        "click-count"
    }

    fn about(&self) -> &str {
        "Counts clicks per user."
    }

    fn build(&self, p: &Params, _: &JobContext) -> Result<JobGraph, String> {
        let env = StreamEnv::new();
        let clicks = SequenceSource::new(p.clicks.unwrap_or(10_000), p.rate.unwrap_or(0), click);
        // A uid names an operator's state in checkpoints and savepoints: set one on every
        // operator and never change it, and a changed job still finds its state.
        let counts = env
            .source(clicks)
            .uid("clicks")
            .key_by(|user: &String| user.clone())
            .process(CountClicks::default())
            .uid("count");
        let line: Encoder<(String, u64)> = Arc::new(|(user, n), out| {
            out.extend_from_slice(format!("{user}\t{n}\n").as_bytes());
        });
        match &p.output {
            Some(dir) => counts.sink(FileSink::new(dir, line)),
            None => counts.sink(PrintSink::new(line)),
        }
        .uid("sink");
        env.build("click-count")
    }

    /// `submit` makes a relative `--output` absolute where it runs, before it sends the job.
    fn paths(p: &mut Params) -> Vec<&mut PathBuf> {
        p.output.iter_mut().collect()
    }
}

fn main() -> ExitCode {
    App::new("myapp").job(ClickCount).run()
}
