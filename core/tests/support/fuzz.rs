//! Fuzzing on stable Rust: proptest feeds a parser byte strings, most of them valid inputs
//! mutated (bit flips, byte edits, insertions and overwrites from a dictionary of tokens,
//! cuts, repeated chunks and lines) so that the parser gets past its first checks, the
//! rest random bytes and random text.
//!
//! A panic fails the test, with the input shrunk by proptest and printed escaped; a case
//! that runs longer than [`HANG`] prints its input and aborts the test binary.
//!
//! - `MMK_FUZZ_CASES`: cases per target (default [`DEFAULT_CASES`], enough for CI; run
//!   more by hand, e.g. `MMK_FUZZ_CASES=20000 cargo test -p mmk-core --test fuzz`);
//! - `MMK_FUZZ_SEED`: the random seed, to replay a run (each run prints its seed).
//!
//! Shared by the `fuzz` tests of several crates (`#[path]`).

#![allow(dead_code)]

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Once};
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseError, TestError, TestRng, TestRunner};

/// Cases per target when `MMK_FUZZ_CASES` is not set.
pub const DEFAULT_CASES: u32 = 256;

/// A case that runs longer than this is a hang.
pub const HANG: Duration = Duration::from_secs(10);

/// Cases per target: `MMK_FUZZ_CASES`, else [`DEFAULT_CASES`].
pub fn cases() -> u32 {
    match std::env::var("MMK_FUZZ_CASES") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("MMK_FUZZ_CASES={v:?} is not a whole number")),
        Err(_) => DEFAULT_CASES,
    }
}

fn seed() -> u64 {
    match std::env::var("MMK_FUZZ_SEED") {
        Ok(v) => v
            .parse()
            .unwrap_or_else(|_| panic!("MMK_FUZZ_SEED={v:?} is not a whole number")),
        Err(_) => {
            use std::hash::{BuildHasher, RandomState};
            RandomState::new().hash_one(Instant::now())
        }
    }
}

/// Runs `check` on [`cases`] inputs made from `seeds` (valid inputs) and `dict` (tokens
/// the format gives meaning to); `name` names the target in what is printed. `check`
/// says whether the parser accepted the input (how many it accepts is printed: a target
/// that accepts none gets little past the parser's first checks).
pub fn fuzz(name: &str, seeds: Vec<Vec<u8>>, dict: &[&[u8]], check: impl Fn(&[u8]) -> bool) {
    assert!(!seeds.is_empty(), "fuzz {name}: no seed inputs");
    let dict: Arc<Vec<Vec<u8>>> = Arc::new(dict.iter().map(|t| t.to_vec()).collect());
    fuzz_values(
        name,
        inputs(Arc::new(seeds), dict),
        |input| format!("{} bytes: b\"{}\"", input.len(), input.escape_ascii()),
        |input| check(input),
    );
}

/// Runs `check` on [`cases`] values of `strategy`; `show` renders one for a report.
pub fn fuzz_values<S: Strategy>(
    name: &str,
    strategy: S,
    show: impl Fn(&S::Value) -> String,
    check: impl Fn(&S::Value) -> bool,
) {
    let cases = cases();
    let seed = seed();
    let executions = AtomicU64::new(0);
    let accepted = AtomicU64::new(0);
    let watch = Watchdog::start(name);
    let config = Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    };
    let mut key = [0u8; 32];
    for chunk in key.chunks_mut(8) {
        chunk.copy_from_slice(&seed.to_le_bytes());
    }
    let rng = TestRng::from_seed(RngAlgorithm::ChaCha, &key);
    let mut runner = TestRunner::new_with_rng(config, rng);
    quiet_panics();
    IN_FUZZ.set(true);
    let result = runner.run(&strategy, |input| {
        executions.fetch_add(1, Ordering::Relaxed);
        let _timed = watch.begin(|| show(&input));
        if check(&input) {
            accepted.fetch_add(1, Ordering::Relaxed);
        }
        Ok::<(), TestCaseError>(())
    });
    IN_FUZZ.set(false);
    watch.stop();
    let n = executions.load(Ordering::Relaxed);
    let ok = accepted.load(Ordering::Relaxed);
    eprintln!("fuzz {name}: {n} executions, {ok} accepted (MMK_FUZZ_SEED={seed})");
    match result {
        Ok(()) => {}
        Err(TestError::Fail(_, input)) => panic!(
            "fuzz {name}: {}\ninput (MMK_FUZZ_SEED={seed}): {}",
            LAST_PANIC.take().unwrap_or_default(),
            show(&input)
        ),
        Err(e) => panic!("fuzz {name}: {e}"),
    }
}

thread_local! {
    /// Whether this thread runs fuzz cases, whose panics are reported once, at the end.
    static IN_FUZZ: Cell<bool> = const { Cell::new(false) };
    /// Where and why the last case of this thread panicked.
    static LAST_PANIC: Cell<Option<String>> = const { Cell::new(None) };
}

/// Keeps the panics of fuzz cases quiet (shrinking panics many times) but remembers the
/// last one's place; other threads' panics print as usual.
fn quiet_panics() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let usual = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            if IN_FUZZ.get() {
                LAST_PANIC.set(Some(info.to_string()));
            } else {
                usual(info);
            }
        }));
    });
}

/// Mutated seeds (most cases), random bytes and random printable text.
fn inputs(seeds: Arc<Vec<Vec<u8>>>, dict: Arc<Vec<Vec<u8>>>) -> impl Strategy<Value = Vec<u8>> {
    let n = seeds.len();
    // Mostly a few edits, which keep much of the input valid; sometimes many.
    let edits = prop_oneof![
        3 => vec((any::<u8>(), any::<u32>(), any::<u8>()), 1..4),
        1 => vec((any::<u8>(), any::<u32>(), any::<u8>()), 0..32),
    ];
    let mutated = (0..n, edits).prop_map(move |(i, edits)| mutate(&seeds[i], &edits, &dict));
    let text = vec(prop_oneof![32u8..127, Just(b'\n'), Just(b'\t')], 0..512);
    prop_oneof![
        6 => mutated,
        1 => vec(any::<u8>(), 0..1024),
        1 => text,
    ]
}

/// Applies `edits` (kind, position, byte) to a copy of `seed`: a bit flipped, a byte set,
/// inserted or removed, a cut, a token of `dict` inserted or written over (also at an
/// aligned place, for binary layouts), a chunk or a line repeated, a line removed.
pub fn mutate(seed: &[u8], edits: &[(u8, u32, u8)], dict: &[Vec<u8>]) -> Vec<u8> {
    let mut d = seed.to_vec();
    for &(kind, pos, b) in edits {
        let at = |len: usize| if len == 0 { 0 } else { pos as usize % len };
        let token = (!dict.is_empty()).then(|| &dict[b as usize % dict.len()]);
        match kind % 11 {
            0 if !d.is_empty() => {
                let i = at(d.len());
                d[i] ^= 1 << (b % 8);
            }
            1 if !d.is_empty() => {
                let i = at(d.len());
                d[i] = b;
            }
            2 => {
                let i = at(d.len() + 1);
                d.insert(i, b);
            }
            3 if !d.is_empty() => {
                let i = at(d.len());
                let end = (i + 1 + b as usize % 16).min(d.len());
                d.drain(i..end);
            }
            4 => {
                let i = at(d.len() + 1);
                d.truncate(i);
            }
            5 | 6 if token.is_some() => {
                let t = token.map(Vec::as_slice).unwrap_or_default();
                let i = at(d.len() + 1);
                if kind % 11 == 5 {
                    d.splice(i..i, t.iter().copied());
                } else {
                    let end = (i + t.len()).min(d.len());
                    d.splice(i..end, t.iter().copied());
                }
            }
            7 if !d.is_empty() => {
                let i = at(d.len());
                let end = (i + 1 + b as usize % 64).min(d.len());
                let chunk = d[i..end].to_vec();
                d.splice(i..i, chunk);
            }
            8 | 9 if !d.is_empty() => {
                // A whole line repeated (8) or removed (9).
                let i = at(d.len());
                let start = d[..i]
                    .iter()
                    .rposition(|c| *c == b'\n')
                    .map_or(0, |p| p + 1);
                let end = d[i..]
                    .iter()
                    .position(|c| *c == b'\n')
                    .map_or(d.len(), |p| i + p + 1);
                if kind % 11 == 8 {
                    let line = d[start..end].to_vec();
                    d.splice(start..start, line);
                } else {
                    d.drain(start..end);
                }
            }
            10 if token.is_some() && !d.is_empty() => {
                // A token over a field of a binary layout: at a multiple of its length.
                let t = token.map(Vec::as_slice).unwrap_or_default();
                let width = t.len().next_power_of_two().max(1);
                let i = at(d.len()) / width * width;
                let end = (i + t.len()).min(d.len());
                d.splice(i..end, t.iter().copied());
            }
            _ => {}
        }
    }
    d
}

/// Aborts the process when one case runs longer than [`HANG`], after printing its input:
/// a hung parser never returns to proptest.
struct Watchdog {
    current: Arc<Mutex<Option<(Instant, String)>>>,
    done: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Watchdog {
    fn start(name: &str) -> Watchdog {
        let current: Arc<Mutex<Option<(Instant, String)>>> = Arc::default();
        let done = Arc::new(AtomicBool::new(false));
        let thread = {
            let (current, done, name) = (current.clone(), done.clone(), name.to_owned());
            std::thread::spawn(move || {
                while !done.load(Ordering::Relaxed) {
                    std::thread::sleep(Duration::from_millis(50));
                    let guard = current.lock().unwrap_or_else(|p| p.into_inner());
                    if let Some((began, input)) = guard.as_ref()
                        && began.elapsed() > HANG
                    {
                        eprintln!(
                            "fuzz {name}: a case ran longer than {HANG:?} (a hang)\ninput: \
                             {input}"
                        );
                        std::process::abort();
                    }
                }
            })
        };
        Watchdog {
            current,
            done,
            thread: Some(thread),
        }
    }

    /// Times one case until the guard drops (also when the case panics).
    fn begin(&self, show: impl FnOnce() -> String) -> Timed<'_> {
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some((Instant::now(), show()));
        Timed(self)
    }

    fn stop(mut self) {
        self.done.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

struct Timed<'a>(&'a Watchdog);

impl Drop for Timed<'_> {
    fn drop(&mut self) {
        *self.0.current.lock().unwrap_or_else(|p| p.into_inner()) = None;
    }
}
