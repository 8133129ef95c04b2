//! Jobs as an application registers them: a name, typed parameters, and a function from the
//! parameters to a job graph.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use cairn::api::JobGraph;
use cairn::cluster::JobFactory;
use clap::{ArgMatches, Args, Command, FromArgMatches};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// What a job is built with besides its parameters.
#[derive(Debug, Clone, Copy, Default)]
pub struct JobContext {
    /// The run's seed (`--seed`): of injected failures, and for jobs that generate their data.
    pub seed: u64,
}

/// A job an application registers with [`App::job`](crate::App::job).
///
/// Its parameters are a type that clap parses from the command line (`myapp run NAME
/// --flag …`, `myapp submit NAME --flag …`) and serde carries as JSON (`POST /jobs`, the
/// coordinator's `_job` record, every worker): one type, so all three are validated alike.
/// [`build`](Job::build) must be a pure function of the parameters and the context: every
/// process of a cluster calls it and must get the same graph (a worker that plans another is
/// refused).
///
/// ```
/// use cairn::api::{JobGraph, StreamEnv};
/// use cairn::connectors::{DiscardSink, GeneratorSource};
/// use cairn_app::{Job, JobContext};
///
/// #[derive(clap::Args, serde::Serialize, serde::Deserialize, Debug, Default)]
/// #[serde(default, deny_unknown_fields)]
/// struct Params {
///     /// How many records to generate.
///     #[arg(long)]
///     records: u64,
/// }
///
/// struct Generate;
///
/// impl Job for Generate {
///     type Params = Params;
///     fn name(&self) -> &str {
///         "generate"
///     }
///     fn build(&self, params: &Params, _: &JobContext) -> Result<JobGraph, String> {
///         let env = StreamEnv::new();
///         env.source(GeneratorSource::new(params.records, 10))
///             .uid("source")
///             .sink(DiscardSink)
///             .uid("sink");
///         env.build("generate")
///     }
/// }
/// ```
pub trait Job: Send + Sync + 'static {
    /// The job's parameters.
    type Params: Args + Serialize + DeserializeOwned + Send + Sync + 'static;

    /// The name it is run and submitted by.
    fn name(&self) -> &str;

    /// One line for `--help`.
    fn about(&self) -> &str {
        ""
    }

    /// Builds the job graph, or says in one line what is wrong with the parameters.
    fn build(&self, params: &Self::Params, ctx: &JobContext) -> Result<JobGraph, String>;

    /// How many records the job's sources read in a run without failures, if known: needed
    /// only to plan `--inject-failures` among them.
    fn source_records(
        &self,
        _params: &Self::Params,
        _ctx: &JobContext,
    ) -> Result<Option<u64>, String> {
        Ok(None)
    }

    /// Configuration keys the parameters themselves set (a SQL script's `SET 'key' =
    /// 'value'`), as pairs applied after the `--config` file and before `-D` and the flags,
    /// so that the command line has the last word. None by default.
    fn config(&self, _params: &Self::Params) -> Result<Vec<(String, String)>, String> {
        Ok(Vec::new())
    }

    /// The parameters that name files or directories. `submit` makes each relative one
    /// absolute against its own current directory before it sends the parameters, so that
    /// `--output out` means the directory under the submitting shell and not one under the
    /// coordinator's or a worker's directory. None by default.
    ///
    /// ```
    /// # use std::path::PathBuf;
    /// # #[derive(clap::Args, serde::Serialize, serde::Deserialize, Debug, Default)]
    /// # struct Params { #[arg(long)] input: PathBuf, #[arg(long)] output: Option<PathBuf> }
    /// fn paths(params: &mut Params) -> Vec<&mut PathBuf> {
    ///     let mut paths = vec![&mut params.input];
    ///     paths.extend(params.output.as_mut());
    ///     paths
    /// }
    /// ```
    fn paths(params: &mut Self::Params) -> Vec<&mut PathBuf> {
        let _ = params;
        Vec::new()
    }
}

/// A registered job with its parameter type erased.
pub(crate) trait AnyJob: Send + Sync {
    fn name(&self) -> &str;
    fn about(&self) -> &str;
    /// `cmd` with the job's parameters added as arguments.
    fn augment(&self, cmd: Command) -> Command;
    /// The parameters parsed from the command line, as JSON.
    fn params_from(&self, matches: &ArgMatches) -> Result<Value, String>;
    fn build(&self, params: &Value, ctx: &JobContext) -> Result<JobGraph, String>;
    fn source_records(&self, params: &Value, ctx: &JobContext) -> Result<Option<u64>, String>;
    /// The configuration the parameters set ([`Job::config`]).
    fn config(&self, params: &Value) -> Result<Vec<(String, String)>, String>;
    /// The parameters with every relative path of [`Job::paths`] made absolute against `cwd`.
    fn absolute_paths(&self, params: &Value, cwd: &Path) -> Result<Value, String>;
}

struct Registered<J>(J);

impl<J: Job> Registered<J> {
    fn decode(&self, params: &Value) -> Result<J::Params, String> {
        J::Params::deserialize(params)
            .map_err(|e| format!("invalid parameters for job '{}': {e}", self.0.name()))
    }
}

impl<J: Job> AnyJob for Registered<J> {
    fn name(&self) -> &str {
        self.0.name()
    }

    fn about(&self) -> &str {
        self.0.about()
    }

    fn augment(&self, cmd: Command) -> Command {
        J::Params::augment_args(cmd)
    }

    fn params_from(&self, matches: &ArgMatches) -> Result<Value, String> {
        let params = J::Params::from_arg_matches(matches).map_err(|e| e.to_string())?;
        serde_json::to_value(&params).map_err(|e| {
            format!(
                "cannot encode the parameters of job '{}': {e}",
                self.0.name()
            )
        })
    }

    fn build(&self, params: &Value, ctx: &JobContext) -> Result<JobGraph, String> {
        self.0.build(&self.decode(params)?, ctx)
    }

    fn source_records(&self, params: &Value, ctx: &JobContext) -> Result<Option<u64>, String> {
        self.0.source_records(&self.decode(params)?, ctx)
    }

    fn config(&self, params: &Value) -> Result<Vec<(String, String)>, String> {
        self.0.config(&self.decode(params)?)
    }

    fn absolute_paths(&self, params: &Value, cwd: &Path) -> Result<Value, String> {
        let mut typed = self.decode(params)?;
        for path in J::paths(&mut typed) {
            if path.is_relative() {
                *path = cwd.join(&*path);
            }
        }
        serde_json::to_value(&typed).map_err(|e| {
            format!(
                "cannot encode the parameters of job '{}': {e}",
                self.0.name()
            )
        })
    }
}

/// The jobs of an application, by name; the [`JobFactory`] its coordinator and workers use.
#[derive(Clone, Default)]
pub(crate) struct Jobs {
    jobs: Arc<Vec<Arc<dyn AnyJob>>>,
}

impl Jobs {
    pub(crate) fn add<J: Job>(&mut self, job: J) {
        let name = job.name().to_string();
        assert!(
            !name.is_empty() && !name.starts_with('-'),
            "a job name must be a word, got '{name}'"
        );
        assert!(
            self.get(&name).is_none(),
            "job '{name}' is registered twice"
        );
        let mut jobs = self.jobs.as_ref().clone();
        jobs.push(Arc::new(Registered(job)));
        self.jobs = Arc::new(jobs);
    }

    pub(crate) fn get(&self, name: &str) -> Option<&Arc<dyn AnyJob>> {
        self.jobs.iter().find(|j| j.name() == name)
    }

    pub(crate) fn all(&self) -> &[Arc<dyn AnyJob>] {
        &self.jobs
    }

    /// The registered names, for error messages.
    pub(crate) fn names(&self) -> String {
        let names: Vec<&str> = self.jobs.iter().map(|j| j.name()).collect();
        if names.is_empty() {
            "none".to_string()
        } else {
            names.join(", ")
        }
    }

    /// The job named `name`, or an error naming the registered ones.
    pub(crate) fn find(&self, name: &str) -> Result<&Arc<dyn AnyJob>, String> {
        self.get(name)
            .ok_or_else(|| format!("unknown job '{name}'; jobs: {}", self.names()))
    }
}

impl JobFactory for Jobs {
    fn has_job(&self, job: &str) -> bool {
        self.get(job).is_some()
    }

    fn build(&self, job: &str, params: &Value, seed: u64) -> Result<JobGraph, String> {
        self.find(job)?.build(params, &JobContext { seed })
    }

    fn source_records(&self, job: &str, params: &Value, seed: u64) -> Result<Option<u64>, String> {
        self.find(job)?.source_records(params, &JobContext { seed })
    }
}

#[cfg(test)]
mod tests {
    use std::path::{Path, PathBuf};

    use cairn::api::{JobGraph, StreamEnv};
    use cairn::connectors::{DiscardSink, GeneratorSource};
    use serde_json::json;

    use super::{AnyJob, Job, JobContext, Registered};

    #[derive(clap::Args, serde::Serialize, serde::Deserialize, Debug, Default)]
    #[serde(default, deny_unknown_fields)]
    struct Params {
        #[arg(long)]
        input: Option<PathBuf>,
        #[arg(long)]
        output: Option<PathBuf>,
        #[arg(long)]
        label: Option<String>,
    }

    struct Copy;

    impl Job for Copy {
        type Params = Params;
        fn name(&self) -> &str {
            "copy"
        }
        fn build(&self, _: &Params, _: &JobContext) -> Result<JobGraph, String> {
            let env = StreamEnv::new();
            env.source(GeneratorSource::new(1, 1))
                .uid("source")
                .sink(DiscardSink)
                .uid("sink");
            env.build("copy")
        }
        fn paths(p: &mut Params) -> Vec<&mut PathBuf> {
            p.input.iter_mut().chain(p.output.as_mut()).collect()
        }
    }

    #[test]
    fn the_relative_paths_a_job_names_are_made_absolute_and_nothing_else() {
        let params = json!({"input": "/data/in", "output": "out", "label": "out"});
        let absolute = Registered(Copy)
            .absolute_paths(&params, Path::new("/home/me"))
            .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            absolute,
            json!({"input": "/data/in", "output": "/home/me/out", "label": "out"})
        );
    }
}
