//! Job submission: what a server that runs jobs (the coordinator) plugs into the REST API.

/// Starts jobs for `POST /jobs`.
///
/// A server without one (an embedded `cairn run`) answers submissions with 501. The
/// implementation decides what a job is, where it runs and how its arguments are parsed; it
/// should [`JobRegistry::register`](crate::JobRegistry::register) the new job's status in the
/// registry the server serves, so that the returned id can be looked up at once.
///
/// [`submit`](JobSubmitter::submit) is called on a blocking thread of the server's runtime:
/// it may take its time (parse, plan, deploy), but should return once the job is accepted
/// rather than when it ends.
pub trait JobSubmitter: Send + Sync + 'static {
    /// Submits built-in job `job` with `cairn run`-style job flags (e.g.
    /// `["--generate","1000","--output","/x"]`); returns the new job id, or a one-line error
    /// for the user.
    fn submit(&self, job: &str, args: &[String]) -> Result<String, String>;
}
