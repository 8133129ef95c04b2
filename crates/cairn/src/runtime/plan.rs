//! Planning: the job graph cut into chained task vertices, their subtasks' global indices and
//! the pipelined regions. Pure functions of the graph and the configuration, so every process
//! (job master, workers) computes the same plan without talking.

use std::collections::BTreeMap;

use super::graph::{EdgePartition, JobGraph, NodeKind};
use super::job::JobError;
use crate::config::JobConfig;

/// A chain of operators run by one task: its nodes, parallelism, name.
pub(crate) struct Vertex {
    pub(crate) nodes: Vec<usize>,
    pub(crate) parallelism: u32,
    pub(crate) name: String,
    pub(crate) is_source: bool,
}

/// The job graph cut into chained task vertices; computed the same way in every process.
pub struct Plan {
    /// Task vertices (chains), in graph order.
    pub(crate) vertices: Vec<Vertex>,
    /// Per node: its vertex.
    pub(crate) node_vertex: Vec<usize>,
    /// Per vertex: the global index of its subtask 0.
    pub(crate) offsets: Vec<usize>,
    /// Number of subtasks.
    pub(crate) total: usize,
    /// Per node: its parallelism.
    pub(crate) node_parallelism: Vec<u32>,
    /// Number of key groups.
    pub(crate) max_parallelism: u32,
}

impl Plan {
    /// Number of subtasks of the job.
    pub fn total_tasks(&self) -> usize {
        self.total
    }

    /// The largest vertex parallelism: the slots a job needs (one slot holds one subtask of
    /// every vertex, as Flink's slot sharing).
    pub fn slots_needed(&self) -> u32 {
        self.vertices
            .iter()
            .map(|v| v.parallelism)
            .max()
            .unwrap_or(1)
    }

    /// Pipelined regions: sets of global task indices connected by channels. A failure needs
    /// to restart only its region when the failover strategy is `region`.
    pub fn regions(&self, graph: &JobGraph) -> Vec<Vec<usize>> {
        let n = self.vertices.len();
        let mut parent: Vec<usize> = (0..n).collect();
        fn find(p: &mut [usize], x: usize) -> usize {
            let mut r = x;
            while p[r] != r {
                r = p[r];
            }
            p[x] = r;
            r
        }
        for e in graph.edges() {
            let (a, b) = (self.node_vertex[e.from], self.node_vertex[e.to]);
            let (ra, rb) = (find(&mut parent, a), find(&mut parent, b));
            if ra != rb {
                parent[ra] = rb;
            }
        }
        let mut by_root: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
        for (vi, v) in self.vertices.iter().enumerate() {
            let root = find(&mut parent, vi);
            let tasks = by_root.entry(root).or_default();
            tasks.extend(self.offsets[vi]..self.offsets[vi] + v.parallelism as usize);
        }
        by_root.into_values().collect()
    }

    /// Task vertices whose head operator uid starts with `prefix` (all if None).
    pub fn vertices_with_head_prefix(&self, graph: &JobGraph, prefix: Option<&str>) -> Vec<usize> {
        self.vertices
            .iter()
            .enumerate()
            .filter(|(_, v)| prefix.is_none_or(|p| graph.nodes()[v.nodes[0]].uid.starts_with(p)))
            .map(|(i, _)| i)
            .collect()
    }

    /// (vertex, subtask index) of global task `task`.
    pub fn task(&self, task: usize) -> Option<(usize, u32)> {
        let vi = self.offsets.iter().rposition(|&o| o <= task)?;
        Some((vi, (task - self.offsets[vi]) as u32))
    }

    /// The operators of vertex `v`'s chain: (uid, parallelism).
    pub(crate) fn chain_operators(&self, graph: &JobGraph, v: &Vertex) -> Vec<(String, u32)> {
        v.nodes
            .iter()
            .map(|&x| (graph.nodes()[x].uid.clone(), self.node_parallelism[x]))
            .collect()
    }

    /// The task vertices' names, parallelisms and inputs, in graph order, for observers.
    pub fn vertex_views(&self, graph: &JobGraph) -> Vec<super::status::VertexView> {
        self.vertices
            .iter()
            .enumerate()
            .map(|(vi, v)| super::status::VertexView {
                name: v.name.clone(),
                parallelism: v.parallelism,
                inputs: graph
                    .edges()
                    .iter()
                    .filter(|e| self.node_vertex[e.to] == vi && self.node_vertex[e.from] != vi)
                    .map(|e| {
                        let from = self.node_vertex[e.from];
                        let ship = match e.partition {
                            EdgePartition::Default
                                if self.vertices[from].parallelism == v.parallelism =>
                            {
                                "FORWARD"
                            }
                            EdgePartition::Default | EdgePartition::Rebalance => "REBALANCE",
                            EdgePartition::Hash(_) => "HASH",
                            EdgePartition::Broadcast => "BROADCAST",
                        };
                        super::status::VertexInput {
                            vertex: from,
                            ship_strategy: ship.to_string(),
                        }
                    })
                    .collect(),
            })
            .collect()
    }

    /// A fingerprint of everything about the plan that task indices, channel numbers and state
    /// depend on: every operator's kind, uid, name and parallelism, every edge and how it
    /// partitions, the chains and the number of key groups. Processes of a cluster compare it
    /// before deploying, so a worker whose binary builds another graph from the same
    /// parameters is refused instead of exchanging data by mismatched indices. Stable across
    /// processes and builds (FNV-1a over a canonical rendering, not the standard hasher).
    pub fn fingerprint(&self, graph: &JobGraph) -> String {
        let mut text = format!("max-parallelism {}\n", self.max_parallelism);
        for (node, p) in graph.nodes().iter().zip(&self.node_parallelism) {
            let kind = match node.kind {
                NodeKind::Source { .. } => "source",
                NodeKind::OneInput { .. } => "one-input",
                NodeKind::TwoInput { .. } => "two-input",
            };
            let sink = if node.sink_init.is_some() {
                " sink"
            } else {
                ""
            };
            text.push_str(&format!(
                "node {} {kind}{sink} uid={:?} name={:?} p={p}\n",
                node.id, node.uid, node.name
            ));
        }
        for e in graph.edges() {
            text.push_str(&format!(
                "edge {}->{} port {} {}\n",
                e.from,
                e.to,
                e.port,
                e.partition.name()
            ));
        }
        for v in &self.vertices {
            text.push_str(&format!("chain {:?} p={}\n", v.nodes, v.parallelism));
        }
        let hash = text.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        });
        format!("{hash:016x}")
    }

    /// Task infos (without mailboxes) for every subtask, in global order.
    pub fn task_descriptions(&self, graph: &JobGraph) -> Vec<TaskDescription> {
        let mut out = Vec::with_capacity(self.total);
        for v in &self.vertices {
            for i in 0..v.parallelism {
                out.push(TaskDescription {
                    name: v.name.clone(),
                    subtask: i,
                    is_source: v.is_source,
                    operators: self.chain_operators(graph, v),
                });
            }
        }
        out
    }
}

/// One subtask as the job master describes it.
#[derive(Debug, Clone)]
pub struct TaskDescription {
    /// Task (chain) name.
    pub name: String,
    /// Subtask index.
    pub subtask: u32,
    /// Whether it is a source.
    pub is_source: bool,
    /// Operators of its chain: (uid, parallelism).
    pub operators: Vec<(String, u32)>,
}

/// Plans the job graph into chained task vertices.
pub fn plan(graph: &JobGraph, config: &JobConfig) -> Result<Plan, JobError> {
    let n = graph.nodes().len();
    let maxp = config.max_parallelism;
    let node_parallelism: Vec<u32> = graph
        .nodes()
        .iter()
        .map(|node| node.parallelism.unwrap_or(config.parallelism))
        .collect();
    for (node, &p) in graph.nodes().iter().zip(&node_parallelism) {
        if p > maxp {
            return Err(JobError::Setup(format!(
                "operator '{}' has parallelism {p}, above max parallelism {maxp} (pipeline.max-parallelism)",
                node.uid
            )));
        }
    }
    let ins = |id: usize| graph.edges().iter().filter(move |e| e.to == id);
    let outs = |id: usize| graph.edges().iter().filter(move |e| e.from == id);
    // Node `id` joins its upstream's chain when the edge is point-to-point.
    let chained_to = |id: usize| -> Option<usize> {
        if !matches!(graph.nodes()[id].kind, NodeKind::OneInput { .. }) {
            return None;
        }
        let mut it = ins(id);
        let e = it.next()?;
        if it.next().is_some() || outs(e.from).count() != 1 {
            return None;
        }
        let (pu, pd) = (node_parallelism[e.from], node_parallelism[id]);
        let point_to_point = match e.partition {
            EdgePartition::Default => pu == pd,
            _ => pu == 1 && pd == 1,
        };
        point_to_point.then_some(e.from)
    };
    let mut node_vertex = vec![usize::MAX; n];
    let mut vertices: Vec<Vertex> = Vec::new();
    #[allow(clippy::needless_range_loop)]
    for id in 0..n {
        if chained_to(id).is_some() {
            continue;
        }
        let v = vertices.len();
        let mut nodes = vec![id];
        let mut cur = id;
        while let Some(next) = (0..n).find(|&d| chained_to(d) == Some(cur)) {
            nodes.push(next);
            cur = next;
        }
        for &x in &nodes {
            node_vertex[x] = v;
        }
        let name = nodes
            .iter()
            .map(|&x| graph.nodes()[x].name.as_str())
            .collect::<Vec<_>>()
            .join(" -> ");
        vertices.push(Vertex {
            parallelism: node_parallelism[id],
            is_source: matches!(graph.nodes()[id].kind, NodeKind::Source { .. }),
            nodes,
            name,
        });
    }
    if node_vertex.contains(&usize::MAX) {
        return Err(JobError::Setup("the job graph has a cycle".into()));
    }
    let mut offsets = Vec::with_capacity(vertices.len());
    let mut total = 0usize;
    for v in &vertices {
        offsets.push(total);
        total += v.parallelism as usize;
    }
    Ok(Plan {
        vertices,
        node_vertex,
        offsets,
        total,
        node_parallelism,
        max_parallelism: maxp,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::jobs::wordcount::{self, WordInput, WordOutput};
    use crate::jobs::{backpressure, pipelines};

    fn config(parallelism: u32) -> JobConfig {
        let mut c = JobConfig::default();
        c.set("parallelism.default", &parallelism.to_string())
            .unwrap();
        c
    }

    fn wordcount_graph() -> JobGraph {
        let input = WordInput::Generate { count: 10, keys: 3 };
        wordcount::build(&input, 0, &WordOutput::Discard).unwrap()
    }

    #[test]
    fn a_key_by_cuts_the_chain_and_forward_edges_of_equal_parallelism_chain() {
        let graph = wordcount_graph();
        let p = plan(&graph, &config(4)).unwrap();
        // source | count -> sink: the keyed edge is a cut, the sink is chained to the counter.
        assert_eq!(p.vertices.len(), 2, "{:?}", names(&p));
        assert_eq!(p.vertices[0].nodes.len(), 1);
        assert!(p.vertices[0].is_source);
        assert_eq!(p.vertices[1].nodes.len(), 2);
        assert_eq!(p.total_tasks(), 8);
        assert_eq!(p.slots_needed(), 4);
    }

    #[test]
    fn at_parallelism_one_everything_is_one_chain() {
        let graph = wordcount_graph();
        let p = plan(&graph, &config(1)).unwrap();
        assert_eq!(p.vertices.len(), 1, "{:?}", names(&p));
        assert_eq!(p.total_tasks(), 1);
    }

    #[test]
    fn global_task_indices_map_back_to_vertex_and_subtask() {
        let graph = wordcount_graph();
        let p = plan(&graph, &config(3)).unwrap();
        let mapped: Vec<_> = (0..p.total_tasks()).map(|t| p.task(t)).collect();
        assert_eq!(
            mapped,
            vec![
                Some((0, 0)),
                Some((0, 1)),
                Some((0, 2)),
                Some((1, 0)),
                Some((1, 1)),
                Some((1, 2))
            ]
        );
        let descriptions = p.task_descriptions(&graph);
        assert_eq!(descriptions.len(), 6);
        assert!(descriptions[..3].iter().all(|d| d.is_source));
        assert_eq!(descriptions[4].subtask, 1);
    }

    #[test]
    fn independent_pipelines_are_separate_regions_and_connected_tasks_one() {
        let graph = pipelines::build(10, 3, 0, &WordOutput::Discard).unwrap();
        let p = plan(&graph, &config(2)).unwrap();
        let regions = p.regions(&graph);
        assert_eq!(regions.len(), 2, "{regions:?}");
        let mut all: Vec<usize> = regions.concat();
        all.sort_unstable();
        assert_eq!(all, (0..p.total_tasks()).collect::<Vec<_>>());
        let graph = wordcount_graph();
        let p = plan(&graph, &config(2)).unwrap();
        assert_eq!(p.regions(&graph), vec![vec![0, 1, 2, 3]]);
    }

    #[test]
    fn a_two_input_operator_heads_its_own_task() {
        let args = backpressure::BackpressureArgs {
            records: 10,
            keys: 3,
            sink_rate: 1000,
            output: WordOutput::Discard,
        };
        let graph = backpressure::build(&args).unwrap();
        let p = plan(&graph, &config(2)).unwrap();
        let two_input = p
            .vertices
            .iter()
            .find(|v| {
                matches!(
                    graph.nodes()[v.nodes[0]].kind,
                    crate::runtime::graph::NodeKind::TwoInput { .. }
                )
            })
            .expect("the backpressure job has a two-input operator");
        assert!(!two_input.is_source);
    }

    #[test]
    fn parallelism_above_max_parallelism_is_refused_naming_the_operator() {
        let graph = wordcount_graph();
        let mut c = config(4);
        c.set("pipeline.max-parallelism", "2").unwrap();
        let Err(JobError::Setup(msg)) = plan(&graph, &c) else {
            panic!("expected a setup error");
        };
        assert!(
            msg.contains("parallelism 4") && msg.contains("max parallelism 2"),
            "{msg}"
        );
    }

    #[test]
    fn the_fingerprint_is_stable_and_changes_with_the_graph_and_the_parallelism() {
        let graph = wordcount_graph();
        let at = |g: &JobGraph, p: u32| plan(g, &config(p)).unwrap().fingerprint(g);
        assert_eq!(at(&graph, 2), at(&wordcount_graph(), 2));
        assert_eq!(at(&graph, 2).len(), 16);
        assert_ne!(at(&graph, 2), at(&graph, 3));
        let other = pipelines::build(10, 3, 0, &WordOutput::Discard).unwrap();
        assert_ne!(at(&graph, 2), at(&other, 2));
    }

    fn names(p: &Plan) -> Vec<&str> {
        p.vertices.iter().map(|v| v.name.as_str()).collect()
    }
}
