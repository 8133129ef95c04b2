//! The Kubernetes manifests under `deploy/kubernetes/` against the real binary, without a
//! cluster: every YAML document parses and names its apiVersion, kind and metadata.name; every
//! container that runs `cairn VERB …` passes only flags that `cairn VERB [JOB] --help` lists;
//! probes use `/healthz` (liveness) and `/readyz` (readiness) on the port the process serves
//! them on; the workers' `--coordinator` list names the coordinator StatefulSet's pods through
//! its headless Service; and every key of the Flink configuration in a ConfigMap is accepted by
//! `cairn run wordcount --config FILE`.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::Deserialize;
use serde_norway::{Mapping, Value};

fn cairn() -> Command {
    Command::new(env!("CARGO_BIN_EXE_cairn"))
}

fn manifests_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/kubernetes")
}

/// Every `.yaml`/`.yml` file under `dir`, recursively, sorted.
fn yaml_files(dir: &Path) -> Vec<PathBuf> {
    let mut files = Vec::new();
    let mut dirs = vec![dir.to_path_buf()];
    while let Some(d) = dirs.pop() {
        for entry in std::fs::read_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if matches!(
                path.extension().and_then(|e| e.to_str()),
                Some("yaml" | "yml")
            ) {
                files.push(path);
            }
        }
    }
    files.sort();
    files
}

/// A parsed document and where it came from.
struct Doc {
    file: PathBuf,
    value: Value,
}

impl Doc {
    fn kind(&self) -> &str {
        str_at(&self.value, &["kind"]).unwrap_or_default()
    }
    fn name(&self) -> &str {
        str_at(&self.value, &["metadata", "name"]).unwrap_or_default()
    }
    fn what(&self) -> String {
        format!("{} {} ({})", self.kind(), self.name(), self.file.display())
    }
}

fn documents() -> Vec<Doc> {
    let files = yaml_files(&manifests_dir());
    assert!(!files.is_empty(), "no manifests under deploy/kubernetes");
    let mut docs = Vec::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        for de in serde_norway::Deserializer::from_str(&text) {
            let value = Value::deserialize(de)
                .unwrap_or_else(|e| panic!("{}: not valid YAML: {e}", file.display()));
            // An empty document (a trailing `---`, or only comments) is no object.
            if !value.is_null() {
                docs.push(Doc {
                    file: file.clone(),
                    value,
                });
            }
        }
    }
    docs
}

fn at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a Value> {
    path.iter().try_fold(v, |v, k| v.get(*k))
}

fn str_at<'a>(v: &'a Value, path: &[&str]) -> Option<&'a str> {
    at(v, path).and_then(Value::as_str)
}

/// A scalar as a string (args like `"2"` or `2`).
fn scalar(v: &Value) -> String {
    match v {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        Value::Bool(b) => b.to_string(),
        other => panic!("not a scalar: {other:?}"),
    }
}

/// Every container (and init container) of a document, wherever its pod template is.
fn containers(v: &Value) -> Vec<&Mapping> {
    let mut found = Vec::new();
    fn walk<'a>(v: &'a Value, found: &mut Vec<&'a Mapping>) {
        match v {
            Value::Mapping(m) => {
                for (k, child) in m {
                    if matches!(k.as_str(), Some("containers" | "initContainers")) {
                        if let Some(seq) = child.as_sequence() {
                            found.extend(seq.iter().filter_map(Value::as_mapping));
                            continue;
                        }
                    }
                    walk(child, found);
                }
            }
            Value::Sequence(s) => s.iter().for_each(|c| walk(c, found)),
            _ => {}
        }
    }
    walk(v, &mut found);
    found
}

/// The arguments after `cairn` of a container's command and args (`["cairn"]` + args, or a
/// shell's `-c "… cairn VERB …"`), or None when it does not run cairn.
fn cairn_argv(container: &Mapping) -> Option<Vec<String>> {
    let list = |key: &str| -> Vec<String> {
        container
            .get(key)
            .and_then(Value::as_sequence)
            .map(|s| s.iter().map(scalar).collect())
            .unwrap_or_default()
    };
    let mut words: Vec<String> = list("command");
    words.extend(list("args"));
    if words.len() >= 3
        && matches!(words[0].rsplit('/').next(), Some("sh" | "bash"))
        && words[1] == "-c"
    {
        words = words[2]
            .split_whitespace()
            .map(|w| w.trim_matches(|c| c == '"' || c == '\'').to_string())
            .collect();
    }
    let at = words
        .iter()
        .position(|w| w.rsplit('/').next() == Some("cairn"))?;
    Some(words[at + 1..].to_vec())
}

/// What a `--help` text offers: its flags (long and short, with whether each takes a value)
/// and its subcommands (the `Commands:` and `Jobs:` sections).
#[derive(Default)]
struct Help {
    flags: HashMap<String, bool>,
    subcommands: Vec<String>,
}

fn help(path: &[&str]) -> Help {
    let out = cairn().args(path).arg("--help").output().unwrap();
    assert!(
        out.status.success(),
        "cairn {} --help failed: {}",
        path.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    parse_help(&String::from_utf8_lossy(&out.stdout))
}

fn parse_help(text: &str) -> Help {
    let mut help = Help::default();
    let mut in_subcommands = false;
    for line in text.lines() {
        if !line.starts_with(' ') {
            in_subcommands = matches!(line.trim_end(), "Commands:" | "Jobs:");
            continue;
        }
        let trimmed = line.trim_start();
        // The flag part ends at the first double space (a description may follow on the line).
        let head = trimmed.split("  ").next().unwrap_or_default();
        if trimmed.starts_with('-') {
            let takes_value = head.contains('<');
            for word in head.split_whitespace() {
                let word = word.trim_end_matches(',');
                if word.starts_with('-') {
                    help.flags.insert(word.to_string(), takes_value);
                }
            }
        } else if in_subcommands && line.starts_with("  ") && !line.starts_with("   ") {
            if let Some(name) = head.split_whitespace().next() {
                help.subcommands.push(name.to_string());
            }
        }
    }
    help
}

/// A command line's flags with their values, in order.
type Flags = Vec<(String, Option<String>)>;

/// Checks every flag of `cairn ARGV…` against the help of its verb (and of its job, for
/// `run` and `submit`); returns the verb path (e.g. `["submit", "wordcount"]`) and the flags
/// with their values.
fn check_flags(argv: &[String]) -> Result<(Vec<String>, Flags), String> {
    let verb = argv.first().ok_or("`cairn` without a verb")?;
    let mut path = vec![verb.clone()];
    let top = help(&[]);
    if !top.subcommands.contains(verb) {
        return Err(format!("`cairn {verb}`: no such verb"));
    }
    let mut h = help(&[verb.as_str()]);
    let mut flags = Vec::new();
    let mut rest = argv[1..].iter();
    while let Some(arg) = rest.next() {
        if arg == "--" {
            break;
        }
        if arg.starts_with('-') && arg.len() > 1 {
            let (name, inline) = match arg.split_once('=') {
                Some((n, v)) if n.starts_with("--") => (n.to_string(), Some(v.to_string())),
                _ if !arg.starts_with("--") && arg.len() > 2 => {
                    (arg[..2].to_string(), Some(arg[2..].to_string()))
                }
                _ => (arg.clone(), None),
            };
            let Some(&takes_value) = h.flags.get(&name) else {
                return Err(format!(
                    "`cairn {}` has no flag {name} (see `cairn {} --help`)",
                    path.join(" "),
                    path.join(" ")
                ));
            };
            let value = if takes_value && inline.is_none() {
                Some(rest.next().ok_or(format!("{name} needs a value"))?.clone())
            } else {
                inline
            };
            flags.push((name, value));
        } else if path.len() == 1 && h.subcommands.contains(arg) {
            path.push(arg.clone());
            let p: Vec<&str> = path.iter().map(String::as_str).collect();
            h = help(&p);
        }
    }
    Ok((path, flags))
}

fn flag<'a>(flags: &'a Flags, name: &str) -> Option<&'a str> {
    flags
        .iter()
        .find(|(n, _)| n == name)
        .and_then(|(_, v)| v.as_deref())
}

fn port_of(addr: &str) -> u16 {
    addr.rsplit(':')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no port in {addr}"))
}

/// The container port a probe's or annotation's port means: a number, or a port's name.
fn resolve_port(container: &Mapping, port: &Value) -> u16 {
    if let Some(n) = port.as_u64() {
        return n as u16;
    }
    let name = port.as_str().expect("a port is a number or a name");
    if let Ok(n) = name.parse() {
        return n;
    }
    container
        .get("ports")
        .and_then(Value::as_sequence)
        .into_iter()
        .flatten()
        .find(|p| str_at(p, &["name"]) == Some(name))
        .and_then(|p| at(p, &["containerPort"]).and_then(Value::as_u64))
        .unwrap_or_else(|| panic!("no container port named {name}")) as u16
}

#[test]
fn every_document_names_its_api_version_kind_and_name() {
    let docs = documents();
    for doc in &docs {
        for path in [&["apiVersion"][..], &["kind"], &["metadata", "name"]] {
            assert!(
                str_at(&doc.value, path).is_some_and(|s| !s.is_empty()),
                "{}: a document without {}",
                doc.file.display(),
                path.join(".")
            );
        }
    }
    let kinds: Vec<&str> = docs.iter().map(Doc::kind).collect();
    for kind in [
        "StatefulSet",
        "Deployment",
        "Service",
        "ConfigMap",
        "PersistentVolumeClaim",
    ] {
        assert!(kinds.contains(&kind), "no {kind} among {kinds:?}");
    }
}

/// Every `cairn` command line of every container, with the flags checked against `--help`.
#[test]
fn containers_pass_only_flags_cairn_has_and_probe_healthz_and_readyz() {
    let docs = documents();
    let mut verbs = Vec::new();
    for doc in &docs {
        for container in containers(&doc.value) {
            let cname = container.get("name").map(scalar).unwrap_or_default();
            let where_ = format!("container {cname} of {}", doc.what());
            let argv =
                cairn_argv(container).unwrap_or_else(|| panic!("{where_} does not run cairn"));
            let (path, flags) = check_flags(&argv).unwrap_or_else(|e| panic!("{where_}: {e}"));
            // Probes: liveness (and startup) on /healthz, readiness on /readyz, on the port the
            // process serves them: a coordinator's --rest, a worker's --metrics.
            let served = match path[0].as_str() {
                "coordinator" => flag(&flags, "--rest").map(port_of),
                "worker" => flag(&flags, "--metrics").map(port_of),
                _ => None,
            };
            for (probe, want) in [
                ("livenessProbe", "/healthz"),
                ("startupProbe", "/healthz"),
                ("readinessProbe", "/readyz"),
            ] {
                let Some(p) = container.get(probe) else {
                    assert!(
                        served.is_none() || probe == "startupProbe",
                        "{where_}: no {probe}"
                    );
                    continue;
                };
                let get = at(p, &["httpGet"]).unwrap_or_else(|| panic!("{where_}: {probe}"));
                assert_eq!(str_at(get, &["path"]), Some(want), "{where_}: {probe}");
                let port = resolve_port(container, get.get("port").expect("a probe's port"));
                let served = served.unwrap_or_else(|| {
                    panic!("{where_}: {probe} on a process that serves no health endpoints")
                });
                assert_eq!(port, served, "{where_}: {probe}'s port");
            }
            // Prometheus annotations name the port /metrics is served on.
            if let (Some(ann), Some(served)) = (
                at(&doc.value, &["spec", "template", "metadata", "annotations"]),
                served,
            ) {
                assert_eq!(str_at(ann, &["prometheus.io/path"]), Some("/metrics"));
                let port = str_at(ann, &["prometheus.io/port"]).map(|p| p.parse::<u16>().unwrap());
                assert_eq!(port, Some(served), "{where_}: prometheus.io/port");
            }
            verbs.push((doc, path, flags));
        }
    }
    let names: Vec<String> = verbs.iter().map(|(_, p, _)| p.join(" ")).collect();
    for want in ["coordinator", "worker", "submit wordcount"] {
        assert!(
            names.iter().any(|n| n == want),
            "no container runs `cairn {want}`: {names:?}"
        );
    }

    // The workers reach every coordinator replica by its stable name: <statefulset>-<i>.<its
    // headless Service>:<--bind port>, for each of the StatefulSet's replicas.
    let (sts_doc, _, coordinator_flags) = verbs
        .iter()
        .find(|(d, p, _)| p[0] == "coordinator" && d.kind() == "StatefulSet")
        .expect("the coordinators are a StatefulSet");
    let bind_port = port_of(flag(coordinator_flags, "--bind").expect("--bind"));
    let replicas = at(&sts_doc.value, &["spec", "replicas"])
        .and_then(Value::as_u64)
        .unwrap();
    let service = str_at(&sts_doc.value, &["spec", "serviceName"]).unwrap();
    let headless = docs
        .iter()
        .find(|d| d.kind() == "Service" && d.name() == service)
        .unwrap_or_else(|| panic!("no Service {service}"));
    assert_eq!(
        str_at(&headless.value, &["spec", "clusterIP"]),
        Some("None")
    );
    assert_eq!(
        at(&headless.value, &["spec", "publishNotReadyAddresses"]).and_then(Value::as_bool),
        Some(true),
        "a standby is not Ready, yet its name must resolve"
    );
    let expected: Vec<String> = (0..replicas)
        .map(|i| format!("{}-{i}.{service}:{bind_port}", sts_doc.name()))
        .collect();
    for (doc, path, flags) in &verbs {
        if path[0] == "worker" {
            let list = flag(flags, "--coordinator").expect("--coordinator");
            assert_eq!(
                list.split(',').collect::<Vec<_>>(),
                expected,
                "{}",
                doc.what()
            );
        }
    }

    // A client's --rest http://SERVICE:PORT is a Service with that port.
    for (doc, path, flags) in &verbs {
        if let (false, Some(rest)) = (
            matches!(path[0].as_str(), "coordinator" | "run"),
            flag(flags, "--rest"),
        ) {
            let hostport = rest.trim_start_matches("http://");
            let (host, port) = hostport.split_once(':').expect("--rest HOST:PORT");
            let svc = docs
                .iter()
                .find(|d| d.kind() == "Service" && d.name() == host)
                .unwrap_or_else(|| panic!("{}: no Service {host}", doc.what()));
            let ports: Vec<u64> = at(&svc.value, &["spec", "ports"])
                .and_then(Value::as_sequence)
                .into_iter()
                .flatten()
                .filter_map(|p| at(p, &["port"]).and_then(Value::as_u64))
                .collect();
            assert!(
                ports.contains(&port.parse().unwrap()),
                "{}: {host} {ports:?}",
                doc.what()
            );
        }
    }
}

/// The check itself fails on what cairn does not have.
#[test]
fn the_flag_check_refuses_made_up_flags_and_verbs() {
    let argv = |s: &str| s.split_whitespace().map(String::from).collect::<Vec<_>>();
    assert!(check_flags(&argv("worker --slots 2 --metrics 0.0.0.0:9249")).is_ok());
    assert!(check_flags(&argv("submit wordcount --config f -p 4 --output /o")).is_ok());
    let e = check_flags(&argv("worker --slots 2 --taskmanager-memory 1g")).unwrap_err();
    assert!(e.contains("--taskmanager-memory"), "{e}");
    // A job's flag is not the verb's: `coordinator` takes no --config.
    assert!(check_flags(&argv("coordinator --config f")).is_err());
    assert!(check_flags(&argv("submit wordcount --no-such-flag")).is_err());
    assert!(check_flags(&argv("jobmanager --bind 0.0.0.0:6123")).is_err());
}

/// The `kcairn …` command lines of the README's shell blocks (the `cairn` of a coordinator
/// pod), each checked like a container's.
#[test]
fn readme_commands_pass_only_flags_cairn_has() {
    let readme = std::fs::read_to_string(manifests_dir().join("README.md")).unwrap();
    let mut in_block = false;
    let mut lines = Vec::new();
    let mut pending = String::new();
    for line in readme.lines() {
        let t = line.trim();
        if t.starts_with("```") {
            in_block = t == "```sh";
            continue;
        }
        if !in_block {
            continue;
        }
        match t.strip_suffix('\\') {
            Some(head) => pending.push_str(head),
            None => {
                pending.push_str(t);
                lines.push(std::mem::take(&mut pending));
            }
        }
    }
    let mut checked = 0;
    for line in &lines {
        for (at, _) in line.match_indices("kcairn ") {
            let command = line[at + "kcairn ".len()..]
                .split(['|', ')', '#'])
                .next()
                .unwrap_or_default();
            let argv: Vec<String> = command
                .split_whitespace()
                .map(|w| w.trim_matches('"').to_string())
                .collect();
            check_flags(&argv).unwrap_or_else(|e| panic!("README.md: `{line}`: {e}"));
            checked += 1;
        }
    }
    assert!(checked >= 5, "only {checked} kcairn commands in README.md");
}

/// The keys of a YAML configuration, flattened (`a: {b: 1}` is `a.b`), with their values.
fn flat_keys(prefix: &str, v: &Value, out: &mut BTreeMap<String, String>) {
    match v {
        Value::Mapping(m) => {
            for (k, child) in m {
                let k = scalar(k);
                let key = if prefix.is_empty() {
                    k
                } else {
                    format!("{prefix}.{k}")
                };
                flat_keys(&key, child, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), scalar(other));
        }
    }
}

/// Runs a tiny embedded wordcount with `config` as its --config file; absolute paths it sets
/// are pointed into a temporary directory with -D (which takes precedence), so the run writes
/// nothing outside it while every key of the file is still read and validated.
fn run_with_config(config: &str) -> std::process::Output {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cairn.yaml");
    std::fs::write(&file, config).unwrap();
    let mut cmd = cairn();
    cmd.current_dir(dir.path()).args([
        "run",
        "wordcount",
        "--generate",
        "1000",
        "--keys",
        "10",
        "--discard",
        "--config",
    ]);
    cmd.arg(&file);
    let parsed: Value = serde_norway::from_str(config).expect("the configuration is YAML");
    let mut keys = BTreeMap::new();
    flat_keys("", &parsed, &mut keys);
    for (key, value) in &keys {
        if value.starts_with('/') {
            let local = dir.path().join(key);
            cmd.arg("-D").arg(format!("{key}={}", local.display()));
        }
    }
    cmd.output().unwrap()
}

#[test]
fn every_flink_configuration_in_a_config_map_is_accepted() {
    let docs = documents();
    let mut checked = 0;
    for doc in docs.iter().filter(|d| d.kind() == "ConfigMap") {
        let Some(data) = at(&doc.value, &["data"]).and_then(Value::as_mapping) else {
            continue;
        };
        for (name, text) in data {
            let name = scalar(name);
            if !(name.ends_with(".yaml") || name.ends_with(".yml")) {
                continue;
            }
            let text = scalar(text);
            let out = run_with_config(&text);
            assert!(
                out.status.success(),
                "{} {name}: cairn refuses it: {}",
                doc.what(),
                String::from_utf8_lossy(&out.stderr)
            );
            checked += 1;
        }
    }
    assert!(checked > 0, "no ConfigMap holds a Flink configuration file");
    // And the same check refuses a key cairn does not know.
    let out = run_with_config(
        "execution.checkpointing.interval: 10s\ntaskmanager.numberOfTaskSlots: 2\n",
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("taskmanager.numberOfTaskSlots"));
}
