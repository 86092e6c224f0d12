//! Prefix reuse in the serving path (issue 19): questions that share a token prefix compute it
//! once, within a batch and across batches, through [`PrefixState`] snapshots kept in a
//! [`PrefixCache`] shared by a device's engines.
//!
//! A batch is planned ([`PrefixReuse::plan_mixed`]; [`PrefixReuse::plan`] for text alone) then
//! run ([`execute_mixed`]). Each question has a namespace (the weights that take its snapshots
//! and, for a screenshot, the image: [`screenshot_namespace`]) and an anchor (a prefix its
//! namespace always snapshots):
//!
//! 1. Each question looks up the longest cached prefix of its ids (a token left to it).
//! 2. Questions of one namespace that share a prefix of at least [`MIN_SHARED_TOKENS`] beyond what
//!    the cache holds for them form groups (one level; chosen to save the most tokens: a small
//!    dynamic programme over the questions in sorted order, where adjacent common prefixes give
//!    every range's common prefix). Each group's prefix runs once in a first pass, resumed from
//!    the cache where it can be, and its snapshot is cached.
//! 3. Every question then runs as one segment resumed from its best snapshot (second pass).
//!
//! Anchors carry reuse across requests. For text it is the end of the system turn
//! (`…<|im_start|>user\n`), the same ids for every Cua-S1 text prompt; for a screenshot, the system
//! turn and the image ([`image_anchor`]). When the cache lacks one and only one question of the
//! batch would resume from it, that question's own segment leaves the anchor's snapshot on its
//! way past it (no token computed twice, no extra pass: the one question on a new screenshot).
//! Otherwise it is computed in the first pass and the questions resume from it, or, where that
//! costs less than a second pass ([`PASS_COST_TOKENS`]: the system turn under one question),
//! beside the questions in their only pass. With nothing to reuse and the anchors cached, a batch
//! runs exactly as without reuse: one [`Decider::decide`] call.
//!
//! Boundaries sit on the backend's resume grid ([`PrefixReuse::on_grid`]): on CUDA, multiples of
//! the delta rule's 64-token chunk, where a resumed sequence computes what the whole prompt does
//! (off the grid its chunks would restart at the boundary and round differently). Group prefixes
//! and anchors are cut down to the grid; the CPU resumes exactly anywhere.
//!
//! Every serving backend carries states; a budget of 0 turns reuse off.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;

use anyhow::Context;
use instinct_kernels::Backend;
use instinct_model::chat::ChatTemplate;
use instinct_model::decider::{Decider, ImagePrompt, Prompt, QuestionSegment, SegmentAnswer};
use instinct_model::forward::BatchLimits;
use instinct_model::prefix::PrefixState;
use instinct_model::prefix_cache::{Hit, Inserted, PrefixCache};
use instinct_model::tokenizer::Tokenizer;
use metrics::{counter, gauge};
use parking_lot::Mutex;

/// Counter: text questions that resumed from a cached snapshot.
pub const HITS_TOTAL: &str = "instinct_prefix_cache_hits_total";
/// Counter: text questions that found no cached snapshot (with reuse on).
pub const MISSES_TOTAL: &str = "instinct_prefix_cache_misses_total";
/// Counter: prompt tokens that questions took from cached snapshots instead of computing.
pub const HIT_TOKENS_TOTAL: &str = "instinct_prefix_cache_hit_tokens_total";
/// Gauge: bytes of snapshots held.
pub const BYTES: &str = "instinct_prefix_cache_bytes";
/// Gauge: the cache's budget (`--prefix-cache-mib`; 0 where reuse is off).
pub const BUDGET_BYTES: &str = "instinct_prefix_cache_budget_bytes";
/// Counter: snapshots evicted to stay within the budget.
pub const EVICTIONS_TOTAL: &str = "instinct_prefix_cache_evictions_total";
/// Counter: prompt tokens run through the model (segments' own tokens, prefixes included), to
/// read beside `instinct_prompt_tokens_total`.
pub const PROMPT_TOKENS_COMPUTED_TOTAL: &str = "instinct_prompt_tokens_computed_total";
/// Counter: forward passes run (one a batch, or two where a shared prefix runs first), so the
/// passes a decision costs can be read beside `instinct_decisions_total`.
pub const FORWARD_PASSES_TOTAL: &str = "instinct_forward_passes_total";

/// Every counter above, exported from zero.
pub const COUNTERS: &[&str] = &[
    HITS_TOTAL,
    MISSES_TOTAL,
    HIT_TOKENS_TOTAL,
    EVICTIONS_TOTAL,
    PROMPT_TOKENS_COMPUTED_TOTAL,
    FORWARD_PASSES_TOTAL,
];

/// The namespace of the text decider's snapshots (its weights: base + text adapter).
pub const TEXT_NAMESPACE: &str = "text";

/// The shortest shared prefix worth a first pass: one 64-token chunk of the delta rule. Below it
/// each question saves less than one chunk of work, while the split costs a second pass (the
/// weights read again) and staging a snapshot (about 50 MB of DeltaNet state on Qwen3.5-4B, the
/// same whatever the prefix's length).
pub const MIN_SHARED_TOKENS: usize = 64;

/// What a second forward pass costs, in prompt tokens: it reads the weights again. On an H200 a
/// 139-id question takes 4.6 ms and a 712-id one 12.1 ms, so about 2.8 ms of a pass is fixed: the
/// time of ~230 tokens. An anchor is computed beside the questions (and not resumed from) while
/// that costs fewer tokens than a first pass would.
pub const PASS_COST_TOKENS: usize = 256;

/// What reuse did so far (the metrics hold the same counts; tests read these per engine set).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ReuseStats {
    pub hits: u64,
    pub misses: u64,
    pub hit_tokens: u64,
    pub evictions: u64,
    pub computed_tokens: u64,
    /// Forward passes run (a batch with a first pass runs two).
    pub passes: u64,
}

#[derive(Default)]
struct Counters {
    hits: AtomicU64,
    misses: AtomicU64,
    hit_tokens: AtomicU64,
    evictions: AtomicU64,
    computed_tokens: AtomicU64,
    passes: AtomicU64,
}

/// The prefix cache of one device's engines and how they plan with it. Shared (`Arc`) by the
/// engines; the lock is held for lookups and inserts only, never across a forward pass.
pub struct PrefixReuse {
    cache: Option<Mutex<PrefixCache>>,
    /// The ids every text prompt starts with (the system turn); empty when unknown.
    system_ids: Vec<u32>,
    min_shared: usize,
    /// Boundaries are multiples of it ([`Self::on_grid`]).
    grid: usize,
    /// Whether a question's own segment may take a prefix's snapshot ([`Self::snapshots_within`]).
    within: bool,
    /// Set once the system snapshot turned out larger than the budget: not taken again.
    system_too_large: AtomicBool,
    counters: Counters,
}

impl PrefixReuse {
    /// Reuse with a cache of `budget` bytes (0: off); `system_ids` as [`system_prefix_ids`].
    pub fn new(budget: usize, system_ids: Vec<u32>) -> Self {
        Self::with_min_shared(budget, system_ids, MIN_SHARED_TOKENS)
    }

    /// [`Self::new`] with another smallest group prefix (tests use short prompts).
    pub fn with_min_shared(budget: usize, system_ids: Vec<u32>, min_shared: usize) -> Self {
        gauge!(BUDGET_BYTES).set(budget as f64);
        gauge!(BYTES).set(0.0);
        Self {
            cache: (budget > 0).then(|| Mutex::new(PrefixCache::new(budget))),
            system_ids,
            min_shared: min_shared.max(1),
            grid: 1,
            within: true,
            system_too_large: AtomicBool::new(false),
            counters: Counters::default(),
        }
    }

    /// The same reuse with every boundary a multiple of `grid` tokens (the backend's, see the
    /// module docs): the system-turn snapshot covers its ids cut down to the grid (none when
    /// shorter than it) and group prefixes are cut down the same way. Cached snapshots are only
    /// ever taken at such boundaries, so lookups find no others.
    pub fn on_grid(mut self, grid: usize) -> Self {
        self.grid = grid.max(1);
        let keep = on_grid(self.system_ids.len(), self.grid);
        self.system_ids.truncate(keep);
        self
    }

    /// The same reuse where an anchor that one question alone resumes from is snapshotted by
    /// that question's own segment (`true`, the default) or, as before, in a pass of its own or
    /// beside the questions (`false`).
    pub fn snapshots_within(mut self, within: bool) -> Self {
        self.within = within;
        self
    }

    /// Whether an anchor one question alone resumes from is snapshotted by that question's own
    /// segment ([`Self::snapshots_within`]).
    pub fn takes_snapshots_within(&self) -> bool {
        self.within
    }

    /// The resume grid boundaries sit on.
    pub fn grid(&self) -> usize {
        self.grid
    }

    /// No reuse: every batch runs whole (tokens computed are still counted).
    pub fn off() -> Self {
        Self::new(0, Vec::new())
    }

    pub fn enabled(&self) -> bool {
        self.cache.is_some()
    }

    /// The cache's budget in bytes (0 when off).
    pub fn budget(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.lock().budget())
    }

    /// Bytes of snapshots held.
    pub fn bytes(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.lock().bytes())
    }

    /// Snapshots held.
    pub fn entries(&self) -> usize {
        self.cache.as_ref().map_or(0, |c| c.lock().len())
    }

    /// Entries and bytes recounted from the tree, against [`Self::entries`] and [`Self::bytes`].
    pub fn recount(&self) -> (usize, usize) {
        self.cache.as_ref().map_or((0, 0), |c| c.lock().recount())
    }

    /// The system-turn ids this reuse snapshots (cut down to the grid).
    pub fn system_ids(&self) -> &[u32] {
        &self.system_ids
    }

    /// Drops every snapshot.
    pub fn clear(&self) {
        if let Some(cache) = &self.cache {
            let mut cache = cache.lock();
            cache.clear();
            gauge!(BYTES).set(0.0);
        }
    }

    pub fn stats(&self) -> ReuseStats {
        let c = &self.counters;
        let get = |a: &AtomicU64| a.load(Ordering::Relaxed);
        ReuseStats {
            hits: get(&c.hits),
            misses: get(&c.misses),
            hit_tokens: get(&c.hit_tokens),
            evictions: get(&c.evictions),
            computed_tokens: get(&c.computed_tokens),
            passes: get(&c.passes),
        }
    }

    /// Counts one forward pass and the tokens it ran through the model.
    pub fn count_computed(&self, tokens: usize) {
        self.counters.passes.fetch_add(1, Ordering::Relaxed);
        counter!(FORWARD_PASSES_TOTAL).increment(1);
        self.counters
            .computed_tokens
            .fetch_add(tokens as u64, Ordering::Relaxed);
        counter!(PROMPT_TOKENS_COMPUTED_TOTAL).increment(tokens as u64);
    }

    /// Counts lookups that found `cached` tokens each (0: a miss).
    fn count_lookups(&self, cached: &[usize]) {
        let c = &self.counters;
        for hit in cached {
            if *hit > 0 {
                c.hits.fetch_add(1, Ordering::Relaxed);
                c.hit_tokens.fetch_add(*hit as u64, Ordering::Relaxed);
                counter!(HITS_TOTAL).increment(1);
                counter!(HIT_TOKENS_TOTAL).increment(*hit as u64);
            } else {
                c.misses.fetch_add(1, Ordering::Relaxed);
                counter!(MISSES_TOTAL).increment(1);
            }
        }
    }

    /// The longest cached prefix of `ids` that leaves it a token (a chunked question's first
    /// chunk resumes from it), counted as a hit or a miss; `None` when reuse is off or nothing is
    /// cached.
    pub fn lookup(&self, namespace: &str, ids: &[u32]) -> Option<Hit> {
        let cache = self.cache.as_ref()?;
        let hit = cache
            .lock()
            .longest_prefix(namespace, ids, ids.len().saturating_sub(1));
        self.count_lookups(&[hit.as_ref().map_or(0, |h| h.tokens)]);
        hit
    }

    /// Caches the snapshot of `ids`.
    fn store(&self, namespace: &str, ids: &[u32], state: Arc<PrefixState>) -> anyhow::Result<()> {
        let Some(cache) = &self.cache else {
            return Ok(());
        };
        let mut cache = cache.lock();
        let inserted = cache.insert(namespace, ids, state)?;
        match inserted {
            Inserted::Stored { evicted } if evicted > 0 => {
                self.counters
                    .evictions
                    .fetch_add(evicted as u64, Ordering::Relaxed);
                counter!(EVICTIONS_TOTAL).increment(evicted as u64);
            }
            Inserted::TooLarge if ids == self.system_ids.as_slice() => {
                self.system_too_large.store(true, Ordering::Relaxed);
            }
            _ => {}
        }
        gauge!(BYTES).set(cache.bytes() as f64);
        Ok(())
    }

    /// Plans a batch of text questions of `namespace` (see the module docs), the system turn as
    /// their anchor: [`Self::plan_mixed`].
    pub fn plan(&self, namespace: &str, prompts: &[&[u32]], limits: BatchLimits) -> Plan {
        let questions: Vec<Planned> = prompts
            .iter()
            .map(|ids| Planned {
                namespace,
                ids,
                anchor: &self.system_ids,
            })
            .collect();
        self.plan_mixed(&questions, limits)
    }

    /// Plans a batch of questions, each in its own namespace (see the module docs): groups form
    /// within a namespace only, and each namespace's anchor is snapshotted when its cache lacks
    /// it. `limits` are the pass's: a plan whose passes would not fit them drops the anchor
    /// snapshots (nothing else can overflow: each pass has no more tokens and sequences than the
    /// batch).
    pub fn plan_mixed(&self, questions: &[Planned<'_>], limits: BatchLimits) -> Plan {
        let n = questions.len();
        let Some(cache) = &self.cache else {
            return Plan::whole(n);
        };
        let mut cache = cache.lock();
        let hits: Vec<Option<Hit>> = questions
            .iter()
            .map(|q| cache.longest_prefix(q.namespace, q.ids, q.ids.len().saturating_sub(1)))
            .collect();
        let cached: Vec<usize> = hits
            .iter()
            .map(|h| h.as_ref().map_or(0, |h| h.tokens))
            .collect();
        let mut bases: Vec<Base> = hits
            .into_iter()
            .map(|h| h.map_or(Base::Whole, Base::Cached))
            .collect();
        let mut prefixes = Vec::new();
        let mut anchors = Vec::new();
        for members in by_namespace(questions) {
            let q = &questions[members[0]];
            let (namespace, anchor) = (q.namespace, q.anchor);
            let p = anchor.len();
            let ids: Vec<&[u32]> = members.iter().map(|&i| questions[i].ids).collect();
            let held: Vec<usize> = members.iter().map(|&i| cached[i]).collect();
            let mut groups = shared_groups(&ids, &held, self.min_shared, self.grid);
            let starts = |i: usize| {
                let ids = questions[i].ids;
                ids.len() > p && ids.starts_with(anchor)
            };
            let wants_anchor = p > 0
                && !(anchor == self.system_ids.as_slice()
                    && self.system_too_large.load(Ordering::Relaxed))
                && members.iter().any(|&i| starts(i))
                // A group prefix that is the anchor already takes its snapshot.
                && !groups.iter().any(|g| g.tokens == p && starts(members[g.members[0]]))
                && cache
                    .longest_prefix(namespace, anchor, p)
                    .is_none_or(|h| h.tokens < p);
            if wants_anchor {
                // Groups reaching past the anchor would compute it a second time in the first
                // pass; drop them when what they share beyond it saves less than that (the
                // questions about one screenshot: the image, then each its own goal).
                let beyond: usize = groups
                    .iter()
                    .filter(|g| g.tokens > p && starts(members[g.members[0]]))
                    .map(|g| (g.members.len() - 1) * (g.tokens - p))
                    .sum();
                if beyond <= p {
                    groups.retain(|g| !(g.tokens > p && starts(members[g.members[0]])));
                }
                let question = *members.iter().find(|&&i| starts(i)).expect("checked above");
                anchors.push(PrefixJob {
                    question,
                    tokens: p,
                    resume: cache.longest_prefix(namespace, anchor, p - 1),
                });
            }
            for group in groups {
                let first = members[group.members[0]];
                let prefix = &questions[first].ids[..group.tokens];
                let resume = cache.longest_prefix(namespace, prefix, group.tokens - 1);
                let job = prefixes.len();
                prefixes.push(PrefixJob {
                    question: first,
                    tokens: group.tokens,
                    resume,
                });
                for m in group.members {
                    bases[members[m]] = Base::Job {
                        job,
                        tokens: group.tokens,
                    };
                }
            }
        }
        let mut plan = Plan {
            prefixes,
            bases,
            side: None,
            within: Vec::new(),
            cached,
        };
        let within_grid = self.within.then_some(self.grid);
        for job in anchors {
            plan.add_anchor_job(job, questions, limits, within_grid);
        }
        plan
    }
}

/// One question as [`PrefixReuse::plan_mixed`] sees it.
#[derive(Clone, Copy, Debug)]
pub struct Planned<'a> {
    /// Where its snapshots are kept: the weights that take them and, for a screenshot, the image.
    pub namespace: &'a str,
    pub ids: &'a [u32],
    /// The prefix its namespace snapshots whenever the cache lacks it (on the grid; empty for
    /// none): the system turn for text, through the image for a screenshot. Questions of one
    /// namespace share it.
    pub anchor: &'a [u32],
}

/// The questions of each namespace (indices, in order), namespaces in order of first appearance.
fn by_namespace(questions: &[Planned<'_>]) -> Vec<Vec<usize>> {
    let mut spaces: Vec<(&str, Vec<usize>)> = Vec::new();
    for (i, q) in questions.iter().enumerate() {
        match spaces.iter_mut().find(|(ns, _)| *ns == q.namespace) {
            Some((_, members)) => members.push(i),
            None => spaces.push((q.namespace, vec![i])),
        }
    }
    spaces.into_iter().map(|(_, members)| members).collect()
}

/// The namespace of snapshots taken over a screenshot: the multimodal weights and the image's
/// bytes (its SHA-256), since prompts about different images of one size have the same ids.
pub fn screenshot_namespace(image_key: &[u8; 32]) -> String {
    use std::fmt::Write as _;
    let mut namespace = String::from("screenshot:");
    for b in image_key {
        // Writing to a String cannot fail.
        let _ = write!(namespace, "{b:02x}");
    }
    namespace
}

/// A screenshot prompt's anchor: its ids through its last image token, cut down to `grid` (the
/// system turn and the image, which every question about the image starts with).
pub fn image_anchor(ids: &[u32], image_token_id: u32, grid: usize) -> &[u32] {
    let end = ids
        .iter()
        .rposition(|&t| t == image_token_id)
        .map_or(0, |last| last + 1);
    &ids[..on_grid(end, grid.max(1))]
}

/// The ids every Cua-S1 text prompt starts with: the system turn through `<|im_start|>user\n`,
/// found as the common ids of two prompts whose user messages differ from their first character
/// (the two ways a Cua-S1 user message starts). Prompts are matched by ids, so a wrong guess
/// costs reuse, never an answer.
pub fn system_prefix_ids(tokenizer: &Tokenizer, chat: &ChatTemplate) -> anyhow::Result<Vec<u32>> {
    use instinct_model::prompt::SYSTEM_PROMPT;
    let a = tokenizer.encode(&chat.render(SYSTEM_PROMPT, "Goal: x")?)?;
    let b = tokenizer.encode(&chat.render(SYSTEM_PROMPT, "App: x")?)?;
    let common = common_prefix(&a, &b);
    Ok(a[..common].to_vec())
}

fn common_prefix(a: &[u32], b: &[u32]) -> usize {
    a.iter().zip(b).take_while(|(x, y)| x == y).count()
}

/// `tokens` cut down to a multiple of `grid`.
fn on_grid(tokens: usize, grid: usize) -> usize {
    tokens / grid * grid
}

/// A prefix computed in the first pass (or beside the questions), then cached.
#[derive(Clone, Debug)]
pub struct PrefixJob {
    /// A question whose ids start with the prefix.
    pub question: usize,
    /// Tokens of the prefix.
    pub tokens: usize,
    /// The cached snapshot the prefix resumes from.
    pub resume: Option<Hit>,
}

/// Where a question resumes.
#[derive(Clone, Debug)]
pub enum Base {
    Whole,
    Cached(Hit),
    /// From the snapshot of first-pass job `job`, which covers `tokens`.
    Job {
        job: usize,
        tokens: usize,
    },
}

impl Base {
    fn tokens(&self) -> usize {
        match self {
            Self::Whole => 0,
            Self::Cached(hit) => hit.tokens,
            Self::Job { tokens, .. } => *tokens,
        }
    }
}

/// How a batch of text questions runs.
#[derive(Clone, Debug)]
pub struct Plan {
    /// The first pass: prefixes to compute and cache (empty: the questions' pass is the only one).
    pub prefixes: Vec<PrefixJob>,
    /// Per question.
    pub bases: Vec<Base>,
    /// A prefix run beside the questions, in their pass, only to be cached (the system turn when
    /// there is no first pass).
    pub side: Option<PrefixJob>,
    /// Prefixes snapshotted by their question's own segment in the questions' pass, on its way
    /// past them (`question` takes the snapshot; at most one per question).
    pub within: Vec<PrefixJob>,
    /// Per question: tokens of the cached snapshot its lookup found (0: a miss).
    pub cached: Vec<usize>,
}

impl Plan {
    fn whole(n: usize) -> Self {
        Self {
            prefixes: Vec::new(),
            bases: vec![Base::Whole; n],
            side: None,
            within: Vec::new(),
            cached: Vec::new(),
        }
    }

    /// Whether the batch runs exactly as without reuse.
    pub fn is_whole(&self) -> bool {
        self.prefixes.is_empty()
            && self.side.is_none()
            && self.within.is_empty()
            && self.bases.iter().all(|b| matches!(b, Base::Whole))
    }

    /// Tokens and sequences of the first pass and of the questions' pass.
    fn passes(&self, questions: &[Planned<'_>]) -> [(usize, usize); 2] {
        let own = |j: &PrefixJob| j.tokens - j.resume.as_ref().map_or(0, |h| h.tokens);
        let first = (
            self.prefixes.iter().map(own).sum::<usize>(),
            self.prefixes.len(),
        );
        let side = self.side.as_ref().map_or((0, 0), |j| (own(j), 1));
        let own_tokens: usize = questions
            .iter()
            .zip(&self.bases)
            .map(|(q, b)| q.ids.len() - b.tokens())
            .sum();
        [first, (own_tokens + side.0, questions.len() + side.1)]
    }

    /// Adds an anchor's job: when one question alone would resume from it, to that question's
    /// own segment (its snapshot taken on the way, where `within_grid` allows: `None` never);
    /// else to the first pass, where the questions of its namespace with less resume from it;
    /// or, when there is no first pass and computing the anchor once more costs less than one
    /// ([`PASS_COST_TOKENS`]: the system turn under one question), beside the questions. Left out
    /// if a pass would not fit `limits`.
    fn add_anchor_job(
        &mut self,
        job: PrefixJob,
        questions: &[Planned<'_>],
        limits: BatchLimits,
        within_grid: Option<usize>,
    ) {
        let before = self.clone();
        let p = job.tokens;
        let q = questions[job.question];
        let anchor = &q.ids[..p];
        let resumers: Vec<usize> = (0..questions.len())
            .filter(|&i| {
                let other = &questions[i];
                other.namespace == q.namespace
                    && self.bases[i].tokens() < p
                    && other.ids.len() > p
                    && other.ids.starts_with(anchor)
            })
            .collect();
        if let ([only], Some(grid)) = (&resumers[..], within_grid) {
            let only = *only;
            let from = self.bases[only].tokens();
            let taken = self.within.iter().any(|j| j.question == only);
            if !taken && (p - from).is_multiple_of(grid.max(1)) {
                self.within.push(PrefixJob {
                    question: only,
                    ..job
                });
                return;
            }
        }
        let beside = resumers.len() * p + p <= PASS_COST_TOKENS;
        if self.prefixes.is_empty() && self.side.is_none() && beside {
            self.side = Some(job);
        } else {
            let index = self.prefixes.len();
            self.prefixes.push(job);
            for i in resumers {
                self.bases[i] = Base::Job {
                    job: index,
                    tokens: p,
                };
            }
        }
        let fits = self
            .passes(questions)
            .iter()
            .all(|&(tokens, seqs)| seqs == 0 || limits.check(tokens, seqs).is_ok());
        if !fits {
            *self = before;
        }
    }
}

/// Questions of a batch that run from one shared prefix.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub members: Vec<usize>,
    pub tokens: usize,
}

/// Picks groups of questions sharing a prefix of at least `min_shared` tokens beyond the `cached`
/// tokens of each member (a token left to each, the prefix a multiple of `grid`), to save the most
/// tokens: a group of k sharing
/// L tokens of which c are cached saves (k − 1)·(L − c). Groups are ranges of the questions in
/// sorted order (where the common prefix of a range is the least of its adjacent ones); a
/// dynamic programme over them picks the best partition, O(n²).
pub fn shared_groups(
    prompts: &[&[u32]],
    cached: &[usize],
    min_shared: usize,
    grid: usize,
) -> Vec<Group> {
    let n = prompts.len();
    if n < 2 {
        return Vec::new();
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| prompts[a].cmp(prompts[b]));
    // Capped so that each member keeps a token of its own, then cut down to the grid (a range's
    // common prefix, the least of its adjacent ones, stays on it).
    let grid = grid.max(1);
    let adjacent: Vec<usize> = order
        .windows(2)
        .map(|w| {
            let (a, b) = (prompts[w[0]], prompts[w[1]]);
            let common = common_prefix(a, b)
                .min(a.len().saturating_sub(1))
                .min(b.len().saturating_sub(1));
            on_grid(common, grid)
        })
        .collect();
    // best[e]: most tokens saved over order[..e]; start[e]: where its last range starts.
    let mut best = vec![0usize; n + 1];
    let mut start = vec![0usize; n + 1];
    let mut shared = vec![0usize; n + 1];
    for e in 1..=n {
        best[e] = best[e - 1];
        start[e] = e - 1;
        let mut common = usize::MAX;
        let mut have = cached[order[e - 1]];
        for s in (0..e - 1).rev() {
            common = common.min(adjacent[s]);
            have = have.max(cached[order[s]]);
            if common <= have || common - have < min_shared {
                continue;
            }
            let saved = best[s] + (e - s - 1) * (common - have);
            if saved > best[e] {
                best[e] = saved;
                start[e] = s;
                shared[e] = common;
            }
        }
    }
    let mut groups = Vec::new();
    let mut e = n;
    while e > 0 {
        let s = start[e];
        if e - s >= 2 {
            let mut members: Vec<usize> = order[s..e].to_vec();
            members.sort_unstable();
            groups.push(Group {
                members,
                tokens: shared[e],
            });
        }
        e = s;
    }
    groups.reverse();
    groups
}

/// Runs a batch of text prompts of `namespace` on `decider` as `plan` says: [`execute_mixed`].
pub fn execute<B: Backend>(
    decider: &mut Decider<B>,
    reuse: &PrefixReuse,
    namespace: &str,
    prompts: &[Prompt<'_>],
    plan: &Plan,
) -> anyhow::Result<Vec<Vec<f32>>> {
    execute_mixed(
        decider,
        reuse,
        &vec![namespace; prompts.len()],
        prompts,
        plan,
    )
}

/// Runs a batch on `decider` as `plan` says, `namespaces[i]` the namespace of `prompts[i]`;
/// answers in order. A plan that reuses nothing is one [`Decider::decide`] call, as without
/// reuse.
pub fn execute_mixed<B: Backend>(
    decider: &mut Decider<B>,
    reuse: &PrefixReuse,
    namespaces: &[&str],
    prompts: &[Prompt<'_>],
    plan: &Plan,
) -> anyhow::Result<Vec<Vec<f32>>> {
    let (answers, _) = execute_with_riders(decider, reuse, namespaces, prompts, plan, &[])?;
    Ok(answers)
}

/// One pass of a planned batch (`pass`: its name in the log): its rows counted as computed, and
/// at debug (`INSTINCT_LOG=instinct::prefix_reuse=debug`) its rows, segments and how long it took
/// (the decider returns once its answers are read back, so this is the pass with its staging and
/// snapshots).
fn run_pass<B: Backend>(
    decider: &mut Decider<B>,
    reuse: &PrefixReuse,
    pass: &str,
    segments: &[QuestionSegment<'_>],
) -> anyhow::Result<Vec<SegmentAnswer>> {
    let rows = segments.iter().map(|s| s.prompt.ids.len()).sum();
    reuse.count_computed(rows);
    let started = std::time::Instant::now();
    let outputs = decider.decide_segments(segments)?;
    tracing::debug!(
        pass,
        rows,
        segments = segments.len(),
        ms = started.elapsed().as_secs_f64() * 1e3,
        "forward pass"
    );
    Ok(outputs)
}

/// [`execute_mixed`] with `riders` (segments of other work on the same weights: chunks of long
/// prompts) run in the questions' pass, after the questions, so the batch runs no pass of its own
/// for them; their outputs come back in order. The plan must leave room for them in that pass
/// ([`PrefixReuse::plan_mixed`] with the riders' tokens and sequences taken off its limits).
pub fn execute_with_riders<B: Backend>(
    decider: &mut Decider<B>,
    reuse: &PrefixReuse,
    namespaces: &[&str],
    prompts: &[Prompt<'_>],
    plan: &Plan,
    riders: &[QuestionSegment<'_>],
) -> anyhow::Result<(Vec<Vec<f32>>, Vec<SegmentAnswer>)> {
    reuse.count_lookups(&plan.cached);
    if plan.is_whole() && riders.is_empty() {
        reuse.count_computed(prompts.iter().map(|p| p.ids.len()).sum());
        return Ok((decider.decide(prompts)?, Vec::new()));
    }
    // Caches `state` as the snapshot of `job`'s prefix.
    let store = |job: &PrefixJob, state: Arc<PrefixState>| {
        let ids = &prompts[job.question].ids[..job.tokens];
        reuse.store(namespaces[job.question], ids, state)
    };
    // The first pass: group prefixes (and anchors), snapshots cached.
    let mut made: Vec<Arc<PrefixState>> = Vec::with_capacity(plan.prefixes.len());
    if !plan.prefixes.is_empty() {
        let parts: Vec<Part> = plan
            .prefixes
            .iter()
            .map(|j| Part::job(prompts, j))
            .collect();
        let segments: Vec<QuestionSegment> = parts
            .iter()
            .zip(&plan.prefixes)
            .map(|(part, job)| prefix_segment(part, job))
            .collect();
        let outputs = run_pass(decider, reuse, "prefixes", &segments)?;
        for (job, out) in plan.prefixes.iter().zip(outputs) {
            let state = Arc::new(
                out.snapshot
                    .context("a prefix segment without its snapshot")?,
            );
            store(job, state.clone())?;
            made.push(state);
        }
    }
    // The questions' pass, each resumed from its best snapshot.
    let tails: Vec<Part> = prompts
        .iter()
        .zip(&plan.bases)
        .map(|(p, base)| Part::new(p, base.tokens()..p.ids.len()))
        .collect();
    let side = plan.side.as_ref().map(|job| Part::job(prompts, job));
    let mut segments: Vec<QuestionSegment> = tails
        .iter()
        .zip(&plan.bases)
        .map(|(tail, base)| {
            let resume: Option<&PrefixState> = match base {
                Base::Whole => None,
                Base::Cached(hit) => Some(&*hit.state),
                Base::Job { job, .. } => Some(&*made[*job]),
            };
            QuestionSegment::answer(tail.prompt(), resume)
        })
        .collect();
    for job in &plan.within {
        let segment = &mut segments[job.question];
        segment.snapshot = true;
        segment.snapshot_at = Some(job.tokens - plan.bases[job.question].tokens());
    }
    if let (Some(part), Some(job)) = (&side, &plan.side) {
        segments.push(prefix_segment(part, job));
    }
    segments.extend_from_slice(riders);
    let mut outputs = run_pass(decider, reuse, "questions", &segments)?;
    let rider_outputs = outputs.split_off(outputs.len() - riders.len());
    if let Some(job) = &plan.side {
        let out = outputs.pop().context("the side segment's output")?;
        let state = out
            .snapshot
            .context("a prefix segment without its snapshot")?;
        store(job, Arc::new(state))?;
    }
    for job in &plan.within {
        let state = outputs[job.question]
            .snapshot
            .take()
            .context("a segment without the snapshot it was asked for")?;
        store(job, Arc::new(state))?;
    }
    let answers = outputs
        .into_iter()
        .map(|o| {
            o.probabilities
                .context("an answer segment without probabilities")
        })
        .collect::<anyhow::Result<_>>()?;
    Ok((answers, rider_outputs))
}

/// Tokens `range` of a prompt as a prompt of their own: a screenshot's image cut to match
/// (positions and feature rows), which the part owns.
struct Part<'a> {
    prompt: Prompt<'a>,
    range: std::ops::Range<usize>,
    image: Option<ImagePrompt>,
}

impl<'a> Part<'a> {
    fn new(prompt: &Prompt<'a>, range: std::ops::Range<usize>) -> Self {
        Self {
            prompt: *prompt,
            image: prompt.image.map(|i| i.part(prompt.ids, range.clone())),
            range,
        }
    }

    /// What `job` computes: its prefix beyond the cached part it resumes from.
    fn job(prompts: &[Prompt<'a>], job: &PrefixJob) -> Self {
        let from = job.resume.as_ref().map_or(0, |h| h.tokens);
        Self::new(&prompts[job.question], from..job.tokens)
    }

    fn prompt(&self) -> Prompt<'_> {
        Prompt {
            ids: &self.prompt.ids[self.range.clone()],
            n_options: self.prompt.n_options,
            image: self.image.as_ref(),
        }
    }
}

/// The segment that computes `job`'s prefix (`part`), resumed from its cached part.
fn prefix_segment<'a>(part: &'a Part<'_>, job: &'a PrefixJob) -> QuestionSegment<'a> {
    QuestionSegment {
        prompt: part.prompt(),
        resume: job.resume.as_ref().map(|h| &*h.state),
        snapshot: true,
        snapshot_at: None,
        answer: false,
    }
}

/// Plans and runs a batch of text prompts (see [`PrefixReuse::plan`] and [`execute`]).
pub fn decide<B: Backend>(
    decider: &mut Decider<B>,
    reuse: &PrefixReuse,
    namespace: &str,
    prompts: &[Prompt<'_>],
) -> anyhow::Result<Vec<Vec<f32>>> {
    let (answers, _) = decide_with_riders(decider, reuse, namespace, prompts, &[])?;
    Ok(answers)
}

/// [`decide`] with `riders` (chunks of long prompts) run in the questions' pass
/// ([`execute_with_riders`]), the plan keeping room for them; with no prompts, the riders alone in
/// one pass. Answers in order, then the riders' outputs in order.
pub fn decide_with_riders<B: Backend>(
    decider: &mut Decider<B>,
    reuse: &PrefixReuse,
    namespace: &str,
    prompts: &[Prompt<'_>],
    riders: &[QuestionSegment<'_>],
) -> anyhow::Result<(Vec<Vec<f32>>, Vec<SegmentAnswer>)> {
    if prompts.is_empty() && riders.is_empty() {
        return Ok((Vec::new(), Vec::new()));
    }
    let ids: Vec<&[u32]> = prompts.iter().map(|p| p.ids).collect();
    let whole = decider.limits();
    let rider_tokens: usize = riders.iter().map(|r| r.prompt.ids.len()).sum();
    let limits = BatchLimits::new(
        whole.max_tokens.saturating_sub(rider_tokens),
        whole.max_seqs.saturating_sub(riders.len()),
    );
    let plan = reuse.plan(namespace, &ids, limits);
    let namespaces = vec![namespace; prompts.len()];
    execute_with_riders(decider, reuse, &namespaces, prompts, &plan, riders)
}

/// Plans and runs a batch of questions of several namespaces (`questions[i]` describes
/// `prompts[i]`; see [`PrefixReuse::plan_mixed`] and [`execute_mixed`]).
pub fn decide_mixed<B: Backend>(
    decider: &mut Decider<B>,
    reuse: &PrefixReuse,
    questions: &[Planned<'_>],
    prompts: &[Prompt<'_>],
) -> anyhow::Result<Vec<Vec<f32>>> {
    let plan = reuse.plan_mixed(questions, decider.limits());
    let namespaces: Vec<&str> = questions.iter().map(|q| q.namespace).collect();
    execute_mixed(decider, reuse, &namespaces, prompts, &plan)
}

#[cfg(test)]
mod tests {
    use instinct_kernels::CpuBackend;

    use super::*;

    /// Distinct-looking ids of the demo vocabulary (1,088 ids).
    fn ids(len: usize, seed: u32) -> Vec<u32> {
        (0..len as u32)
            .map(|i| (i.wrapping_mul(2_654_435_761) ^ seed.wrapping_mul(40_503)) % 1000 + 10)
            .collect()
    }

    fn demo_decider(limits: BatchLimits) -> Decider<CpuBackend> {
        instinct_model::demo::load_text(CpuBackend::new(), limits)
            .unwrap()
            .decider
    }

    fn assert_close(a: &[Vec<f32>], b: &[Vec<f32>], what: &str) {
        assert_eq!(a.len(), b.len(), "{what}");
        for (x, y) in a.iter().zip(b) {
            assert_eq!(x.len(), y.len(), "{what}");
            for (p, q) in x.iter().zip(y) {
                assert!((p - q).abs() <= 1e-5, "{what}: {x:?} vs {y:?}");
            }
        }
    }

    /// `prefix` followed by each tail, as three-option questions.
    fn questions(prefix: &[u32], tails: &[Vec<u32>]) -> Vec<Vec<u32>> {
        tails.iter().map(|t| [prefix, t].concat()).collect()
    }

    fn prompts(qs: &[Vec<u32>]) -> Vec<Prompt<'_>> {
        qs.iter().map(|q| Prompt::text(q, 3)).collect()
    }

    #[test]
    fn groups_save_the_most_tokens_and_leave_a_token_to_each_question() {
        let p = ids(600, 1);
        let a = [&p[..500], &[1, 2]].concat();
        let b = [&p[..500], &[3]].concat();
        let c = [&p[..100], &[4, 5, 6]].concat();
        let d = ids(50, 9);
        let all: Vec<&[u32]> = vec![&a, &c, &d, &b];
        // {a, b} at 500 saves 500; {a, b, c} at 100 would save 200.
        let groups = shared_groups(&all, &[0; 4], 64, 1);
        assert_eq!(
            groups,
            vec![Group {
                members: vec![0, 3],
                tokens: 500
            }]
        );
        // A question that is the prefix of another keeps its last token.
        let short = p[..200].to_vec();
        let long = p[..300].to_vec();
        let groups = shared_groups(&[&short, &long], &[0, 0], 64, 1);
        assert_eq!(groups[0].tokens, 199);
        // Under the smallest shared length beyond the cache: no group.
        assert!(shared_groups(&[&a, &b], &[0, 0], 501, 1).is_empty());
        assert!(shared_groups(&[&a, &b], &[450, 450], 64, 1).is_empty());
        assert_eq!(shared_groups(&[&a, &b], &[400, 400], 64, 1)[0].tokens, 500);
        // A member with more cached than the group shares keeps its own snapshot.
        assert!(shared_groups(&[&a, &b], &[0, 500], 64, 1).is_empty());
        assert!(shared_groups(&[&a], &[0], 1, 1).is_empty());
    }

    #[test]
    fn on_a_grid_group_prefixes_and_the_system_turn_are_cut_down_to_it() {
        let p = ids(600, 1);
        let a = [&p[..500], &[1, 2]].concat();
        let b = [&p[..500], &[3]].concat();
        // 500 shared: 448 on a 64 grid, all of it on the CPU's grid of 1.
        assert_eq!(shared_groups(&[&a, &b], &[0, 0], 64, 64)[0].tokens, 448);
        assert_eq!(shared_groups(&[&a, &b], &[0, 0], 64, 1)[0].tokens, 500);
        // What is left beyond a cached 384 is 64 on the grid: still a group; not beyond 448.
        assert_eq!(shared_groups(&[&a, &b], &[384, 384], 64, 64)[0].tokens, 448);
        assert!(shared_groups(&[&a, &b], &[448, 0], 64, 64).is_empty());
        // A question that is the prefix of another keeps a token, then the grid: 128 of 129.
        let short = p[..129].to_vec();
        let long = p[..300].to_vec();
        assert_eq!(
            shared_groups(&[&short, &long], &[0, 0], 64, 64)[0].tokens,
            128
        );
        let short = p[..128].to_vec();
        assert_eq!(
            shared_groups(&[&short, &long], &[0, 0], 64, 64)[0].tokens,
            64
        );

        let reuse = PrefixReuse::new(1 << 20, ids(70, 5)).on_grid(64);
        assert_eq!((reuse.grid(), reuse.system_ids().len()), (64, 64));
        let reuse = PrefixReuse::new(1 << 20, ids(63, 5)).on_grid(64);
        assert!(reuse.system_ids().is_empty());
        // A plan on the grid: the system job covers 64 tokens, nothing off the grid is asked for.
        let reuse = PrefixReuse::new(1 << 30, ids(70, 5)).on_grid(64);
        let q = [ids(70, 5), ids(100, 7)].concat();
        let plan = reuse.plan("text", &[&q], BatchLimits::new(4096, 8));
        assert!(plan.side.is_none() && plan.prefixes.is_empty(), "{plan:?}");
        assert_eq!(plan.within.len(), 1, "taken by the question's own segment");
        assert_eq!(plan.within[0].tokens, 64);
    }

    #[test]
    fn a_batch_with_nothing_to_reuse_runs_as_before() {
        let reuse = PrefixReuse::new(1 << 20, Vec::new());
        let qs = [ids(100, 1), ids(100, 2)];
        let all: Vec<&[u32]> = qs.iter().map(Vec::as_slice).collect();
        let plan = reuse.plan(TEXT_NAMESPACE, &all, BatchLimits::new(1000, 4));
        assert!(plan.is_whole(), "{plan:?}");
        assert_eq!(plan.cached, vec![0, 0]);
        // Off: not even looked up.
        let plan = PrefixReuse::off().plan(TEXT_NAMESPACE, &all, BatchLimits::new(1000, 4));
        assert!(plan.is_whole() && plan.cached.is_empty());
    }

    #[test]
    fn the_system_snapshot_is_left_out_when_its_segment_would_not_fit() {
        let system = ids(70, 3);
        let q = [&system[..], &ids(30, 4)].concat();
        let r = [&system[..], &ids(30, 9)].concat();
        // Shared prefixes too short for a group: the system turn is the only reuse.
        let reuse = PrefixReuse::with_min_shared(1 << 20, system.clone(), 100);
        // Beside two questions (70 · 3 ≤ PASS_COST_TOKENS), if the pass holds 200 + 70 tokens.
        let plan = reuse.plan(TEXT_NAMESPACE, &[&q, &r], BatchLimits::new(250, 4));
        assert!(plan.is_whole(), "{plan:?}");
        let plan = reuse.plan(TEXT_NAMESPACE, &[&q, &r], BatchLimits::new(270, 4));
        let side = plan.side.as_ref().expect("a side job");
        assert_eq!((side.question, side.tokens), (0, 70));
        // One question takes it in its own segment, which costs no token: it always fits.
        let plan = reuse.plan(TEXT_NAMESPACE, &[&q], BatchLimits::new(100, 4));
        assert_eq!(plan.within.len(), 1, "{plan:?}");
        assert_eq!((plan.within[0].question, plan.within[0].tokens), (0, 70));
        // Without snapshots within a segment: beside it, when the pass holds both.
        let apart = PrefixReuse::new(1 << 20, system.clone()).snapshots_within(false);
        assert!(apart
            .plan(TEXT_NAMESPACE, &[&q], BatchLimits::new(100, 4))
            .is_whole());
        let plan = apart.plan(TEXT_NAMESPACE, &[&q], BatchLimits::new(170, 4));
        let side = plan.side.as_ref().expect("a side job");
        assert_eq!((side.question, side.tokens, plan.within.len()), (0, 70, 0));
        // Not for prompts that do not start with it.
        let other = ids(100, 5);
        let plan = reuse.plan(TEXT_NAMESPACE, &[&other], BatchLimits::new(1000, 4));
        assert!(plan.is_whole());
    }

    #[test]
    fn answers_with_reuse_equal_whole_prompts_at_every_boundary() {
        let mut decider = demo_decider(BatchLimits::new(2048, 8));
        for shared in [63, 64, 65, 128, 129, 200] {
            let reuse = PrefixReuse::with_min_shared(1 << 30, Vec::new(), 1);
            let prefix = ids(shared, shared as u32);
            // Tails of 1, 2 and 70 tokens, each starting differently.
            let tails = vec![vec![1], vec![2, 3], ids(70, 7)];
            let qs = questions(&prefix, &tails);
            let ps = prompts(&qs);
            let whole = decider.decide(&ps).unwrap();
            let first = decide(&mut decider, &reuse, TEXT_NAMESPACE, &ps).unwrap();
            assert_close(&first, &whole, &format!("group prefix of {shared}"));
            let tail_tokens = 1 + 2 + 70;
            let s = reuse.stats();
            assert_eq!(s.computed_tokens, (shared + tail_tokens) as u64);
            assert_eq!((s.hits, s.misses), (0, 3));
            assert_eq!(reuse.entries(), 1);
            // The next batch resumes every question from the cache, in one pass.
            let second = decide(&mut decider, &reuse, TEXT_NAMESPACE, &ps).unwrap();
            assert_close(&second, &whole, &format!("cached prefix of {shared}"));
            let s2 = reuse.stats();
            assert_eq!(s2.computed_tokens - s.computed_tokens, tail_tokens as u64);
            assert_eq!((s2.hits, s2.hit_tokens), (3, 3 * shared as u64));
        }
    }

    /// Random batches of one to four questions built from a few stems (so later batches find
    /// earlier prefixes cached), half of them after the system turn, on grids of 1 and 64, with a
    /// small budget (evictions), every third batch carrying a long prompt's first chunk in its
    /// questions' pass: every answer within 1e-5 of the whole prompt's, the chunk's snapshot
    /// resumes its prompt exactly, at most two passes a batch, never more than one anchor's
    /// tokens computed beyond those asked, the cache within its budget.
    #[test]
    fn random_batches_answer_as_whole_prompts() {
        let mut decider = demo_decider(BatchLimits::new(2048, 8));
        let mut state = 0x853c_49e6_748f_ea9b_u64;
        let mut next = move |n: usize| {
            state = state
                .wrapping_mul(6_364_136_223_846_793_005)
                .wrapping_add(1_442_695_040_888_963_407);
            ((state >> 33) as usize) % n.max(1)
        };
        let system = ids(70, 99);
        let stems: Vec<Vec<u32>> = (0..3).map(|k| ids(40 + 70 * k, 500 + k as u32)).collect();
        let long = ids(150, 777);
        let whole_long = decider.decide(&[Prompt::text(&long, 2)]).unwrap();
        let budget = 450 << 10;
        for grid in [1, 64] {
            let reuse = PrefixReuse::with_min_shared(budget, system.clone(), 16).on_grid(grid);
            for batch in 0..12 {
                let n = 1 + next(4);
                let questions: Vec<Vec<u32>> = (0..n)
                    .map(|q| {
                        let stem = &stems[next(stems.len())];
                        let cut = next(stem.len() + 1);
                        let tail = ids(1 + next(40), (1000 * batch + q) as u32 + 7);
                        let head: &[u32] = if next(2) == 0 { &system } else { &[] };
                        [head, &stem[..cut], &tail].concat()
                    })
                    .collect();
                let ps = prompts(&questions);
                let asked: usize = questions.iter().map(Vec::len).sum();
                let whole = decider.decide(&ps).unwrap();
                let before = reuse.stats();
                let what = format!("grid {grid}, batch {batch}");
                if batch % 3 == 0 {
                    let rider = [QuestionSegment::prefix(&long[..64], None)];
                    let (got, mut riders) =
                        decide_with_riders(&mut decider, &reuse, TEXT_NAMESPACE, &ps, &rider)
                            .unwrap();
                    assert_close(&got, &whole, &what);
                    let snap = riders.remove(0).snapshot.expect("the chunk's snapshot");
                    let tail = QuestionSegment::answer(Prompt::text(&long[64..], 2), Some(&snap));
                    let resumed = decider.decide_segments(&[tail]).unwrap().remove(0);
                    assert_close(&[resumed.probabilities.unwrap()], &whole_long, &what);
                } else {
                    let got = decide(&mut decider, &reuse, TEXT_NAMESPACE, &ps).unwrap();
                    assert_close(&got, &whole, &what);
                }
                let after = reuse.stats();
                let riders = if batch % 3 == 0 { 64 } else { 0 };
                assert!(after.passes - before.passes <= 2, "{what}: {after:?}");
                let computed = (after.computed_tokens - before.computed_tokens) as usize;
                assert!(
                    computed <= asked + riders + system.len(),
                    "{what}: computed {computed} of {asked} + {riders}"
                );
                assert!(reuse.bytes() <= budget, "{what}: {} bytes", reuse.bytes());
            }
            let s = reuse.stats();
            eprintln!(
                "grid {grid}: {s:?}, {} bytes in {} entries",
                reuse.bytes(),
                reuse.entries()
            );
            assert!(s.hits > 0 && s.evictions > 0, "grid {grid}: {s:?}");
        }
    }

    #[test]
    fn on_a_grid_a_shared_prefix_runs_to_its_last_multiple_and_answers_stay_exact() {
        let mut decider = demo_decider(BatchLimits::new(2048, 8));
        for (shared, on_grid) in [(63, 0), (64, 64), (129, 128), (200, 192)] {
            let reuse = PrefixReuse::with_min_shared(1 << 30, Vec::new(), 1).on_grid(64);
            let tails = vec![vec![1], ids(70, 7)];
            let qs = questions(&ids(shared, shared as u32), &tails);
            let ps = prompts(&qs);
            let whole = decider.decide(&ps).unwrap();
            let first = decide(&mut decider, &reuse, TEXT_NAMESPACE, &ps).unwrap();
            assert_close(&first, &whole, &format!("group prefix of {shared}"));
            // The group's prefix ran once, to the grid; each question ran the rest.
            let own: usize = qs.iter().map(|q| q.len() - on_grid).sum();
            assert_eq!(reuse.stats().computed_tokens, (on_grid + own) as u64);
            assert_eq!(reuse.entries(), usize::from(on_grid > 0));
            let second = decide(&mut decider, &reuse, TEXT_NAMESPACE, &ps).unwrap();
            assert_close(&second, &whole, &format!("cached prefix of {shared}"));
            assert_eq!(reuse.stats().hit_tokens, 2 * on_grid as u64);
        }
    }

    #[test]
    fn a_snapshot_evicted_between_planning_and_running_still_serves_its_batch() {
        let mut decider = demo_decider(BatchLimits::new(1024, 4));
        let reuse = PrefixReuse::new(1 << 30, Vec::new());
        let qs = questions(&ids(100, 1), &[vec![5], vec![6]]);
        let ps = prompts(&qs);
        let whole = decider.decide(&ps).unwrap();
        decide(&mut decider, &reuse, TEXT_NAMESPACE, &ps).unwrap();
        let all: Vec<&[u32]> = qs.iter().map(Vec::as_slice).collect();
        let plan = reuse.plan(TEXT_NAMESPACE, &all, decider.limits());
        assert_eq!(plan.cached, vec![100, 100]);
        reuse.clear();
        assert_eq!(reuse.entries(), 0);
        let answers = execute(&mut decider, &reuse, TEXT_NAMESPACE, &ps, &plan).unwrap();
        assert_close(&answers, &whole, "evicted after planning");
    }

    #[test]
    fn two_engines_racing_for_one_prefix_both_answer_and_it_is_cached_once() {
        let limits = BatchLimits::new(1024, 4);
        let (mut a, mut b) = (demo_decider(limits), demo_decider(limits));
        let reuse = PrefixReuse::new(1 << 30, Vec::new());
        let qs = questions(&ids(90, 2), &[vec![5], vec![6, 7]]);
        let ps = prompts(&qs);
        let whole = a.decide(&ps).unwrap();
        let all: Vec<&[u32]> = qs.iter().map(Vec::as_slice).collect();
        // Both plan before either has run: both compute the prefix.
        let plan_a = reuse.plan(TEXT_NAMESPACE, &all, limits);
        let plan_b = reuse.plan(TEXT_NAMESPACE, &all, limits);
        assert_eq!((plan_a.prefixes.len(), plan_b.prefixes.len()), (1, 1));
        let from_a = execute(&mut a, &reuse, TEXT_NAMESPACE, &ps, &plan_a).unwrap();
        let from_b = execute(&mut b, &reuse, TEXT_NAMESPACE, &ps, &plan_b).unwrap();
        assert_close(&from_a, &whole, "first");
        assert_close(&from_b, &whole, "second");
        assert_eq!(reuse.entries(), 1);
        assert_eq!(reuse.recount(), (1, reuse.bytes()));
    }

    #[test]
    fn the_system_turn_is_snapshotted_in_the_only_pass_and_reused_by_the_next_batch() {
        let mut decider = demo_decider(BatchLimits::new(1024, 4));
        let system = ids(70, 3);
        let reuse = PrefixReuse::new(1 << 30, system.clone());
        let first = [system.clone(), ids(30, 4)].concat();
        let whole = decider.decide(&[Prompt::text(&first, 2)]).unwrap();
        let got = decide(
            &mut decider,
            &reuse,
            TEXT_NAMESPACE,
            &[Prompt::text(&first, 2)],
        );
        assert_close(
            &got.unwrap(),
            &whole,
            "the system turn snapshotted on the way",
        );
        assert_eq!(
            reuse.stats().computed_tokens,
            100,
            "no token computed twice"
        );
        assert_eq!(reuse.entries(), 1);
        let next = [system.clone(), ids(40, 5)].concat();
        let whole = decider.decide(&[Prompt::text(&next, 2)]).unwrap();
        let got = decide(
            &mut decider,
            &reuse,
            TEXT_NAMESPACE,
            &[Prompt::text(&next, 2)],
        );
        assert_close(&got.unwrap(), &whole, "resumed from the system snapshot");
        let s = reuse.stats();
        assert_eq!(s.computed_tokens, 100 + 40);
        assert_eq!((s.hits, s.hit_tokens), (1, 70));
    }

    #[test]
    fn a_small_budget_is_never_exceeded_and_answers_stay_exact() {
        let mut decider = demo_decider(BatchLimits::new(2048, 4));
        let reuse = PrefixReuse::new(1 << 20, Vec::new());
        for seed in 0..4 {
            // A 300-token prefix: about 0.7 MiB of snapshot on the demo model; one fits.
            let qs = questions(&ids(300, seed), &[vec![5], vec![6]]);
            let ps = prompts(&qs);
            let whole = decider.decide(&ps).unwrap();
            let got = decide(&mut decider, &reuse, TEXT_NAMESPACE, &ps).unwrap();
            assert_close(&got, &whole, "small budget");
            assert!(reuse.bytes() <= 1 << 20);
            assert_eq!(reuse.recount(), (reuse.entries(), reuse.bytes()));
        }
        assert_eq!(reuse.entries(), 1);
        assert_eq!(reuse.stats().evictions, 3);
        // A prefix whose snapshot is larger than the budget is reused within its batch only.
        let qs = questions(&ids(600, 9), &[vec![5], vec![6]]);
        let ps = prompts(&qs);
        let whole = decider.decide(&ps).unwrap();
        let got = decide(&mut decider, &reuse, TEXT_NAMESPACE, &ps).unwrap();
        assert_close(&got, &whole, "over the budget");
        assert!(reuse.bytes() <= 1 << 20);
    }
}
