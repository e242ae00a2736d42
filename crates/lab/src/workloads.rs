//! Synthetic dynamic-shape workloads: the allocation patterns of PyTorch programs whose tensor
//! sizes change from step to step, which the shared traces lack. Each generator models what
//! PyTorch's caching allocator sees from a documented model (tensor bytes = elements × dtype
//! size, in the order forward allocates and backward frees), with its parameters cited; the
//! distributions of the changing sizes are modelling choices, named where they are made. They
//! exist to check the allocators on cases no rule was tuned on, so nothing in them favours one.
//!
//! | kind | model | what changes step to step |
//! |---|---|---|
//! | `varlen-train` | GPT-2 small (12 layers, d 768, vocab 50,257, context 1,024: Radford et al. 2019), fp32, AdamW | tokens per batch (8 sequences of log-uniform length, no padding, no packing) |
//! | `llm-serve` | TinyLlama-1.1B (22 layers, d 2,048, 4 KV heads of 64, ffn 5,632, vocab 32,000: Zhang et al. 2024), fp16 | requests arrive and leave (continuous batching, Yu et al. 2022); each KV cache grows by `torch.cat` per token (HF `DynamicCache`) |
//! | `moe-train` | 6 MoE layers, d 768, 8 experts of ffn 2,048, top-2 routing (Mixtral's top-2 of 8: Jiang et al. 2024), fp32, AdamW | tokens per expert (Dirichlet(1) shares each step) |
//! | `two-stream-train` | GPT-2 medium (24 layers, d 1,024), fp32, DDP: gradients reduced in 25 MiB buckets (`bucket_cap_mb` default) on a second stream | batch size (4 to 8 sequences of 1,024 tokens) |
//!
//! Peaks run from about 2 GiB (`llm-serve`) to 20 GiB (`two-stream-train`, three steps); the lab
//! fits each in a few seconds at most. Each trace marks where its steps end
//! ([`crate::StepMarks`]; `llm-serve`: every 50 decode steps), so `torch-arena diff --steps`
//! compares two of them.

use super::synth::SplitMix;
use crate::model::{Event, Op, StepMarks, Trace};

const F32: u64 = 4;
const F16: u64 = 2;

/// The workloads, as `synth:KIND[:STEPS[:SEED]]` names them.
pub const KINDS: [&str; 4] = ["varlen-train", "llm-serve", "moe-train", "two-stream-train"];

/// Builds the workload `kind` (one of [`KINDS`]) over `steps` steps from `seed`; `None` for an
/// unknown kind. `steps` is at least 1.
pub fn build(kind: &str, steps: u32, seed: u64) -> Option<Trace> {
    let steps = steps.max(1);
    let t = match kind {
        "varlen-train" => varlen_train(steps, seed),
        "llm-serve" => llm_serve(steps, seed),
        "moe-train" => moe_train(steps, seed),
        "two-stream-train" => two_stream_train(steps, seed),
        _ => return None,
    };
    Some(t)
}

/// An allocation: (id, bytes, stream).
type T = (u64, u64, u64);

/// Builds a trace on any stream, with allocation sites.
struct B {
    events: Vec<Event>,
    sites: Vec<String>,
    next: u64,
    stream: u64,
    /// Event index at the end of each step so far.
    step_ends: Vec<usize>,
}

impl B {
    fn new() -> B {
        B {
            events: Vec::new(),
            sites: vec!["unknown".to_string()],
            next: 1,
            stream: 0,
            step_ends: Vec::new(),
        }
    }

    fn site(&mut self, name: &str) -> u32 {
        match self.sites.iter().position(|s| s == name) {
            Some(i) => i as u32,
            None => {
                self.sites.push(name.to_string());
                (self.sites.len() - 1) as u32
            }
        }
    }

    /// Allocate `bytes` (at least 1) on the current stream, from `site`.
    fn alloc(&mut self, bytes: u64, site: &str) -> T {
        let site = self.site(site);
        let id = self.next;
        self.next += 1;
        let bytes = bytes.max(1);
        self.push(Op::Alloc, id, bytes, site);
        (id, bytes, self.stream)
    }

    fn free(&mut self, t: T) {
        let (id, bytes, stream) = t;
        let keep = self.stream;
        self.stream = stream;
        self.push(Op::Free, id, bytes, 0);
        self.stream = keep;
    }

    fn free_all(&mut self, ts: impl IntoIterator<Item = T>) {
        for t in ts {
            self.free(t);
        }
    }

    fn push(&mut self, op: Op, id: u64, size: u64, site: u32) {
        let time_us = self.events.len() as i64 * 10;
        self.events.push(Event {
            op,
            id,
            size,
            stream: self.stream,
            time_us,
            site,
        });
    }

    /// The step ends here.
    fn end_step(&mut self) {
        self.step_ends.push(self.events.len());
    }

    fn finish(self, name: String) -> Trace {
        let mut t = Trace::synthetic(name, self.events, self.sites);
        t.steps = Some(StepMarks {
            marker: "the workload's own steps".into(),
            ends: self.step_ends,
            before_window: 0,
        });
        t
    }
}

impl SplitMix {
    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 / (1u64 << 53) as f64
    }

    /// Log-uniform in [lo, hi].
    fn log_uniform(&mut self, lo: u64, hi: u64) -> u64 {
        let l = (lo.max(1) as f64).ln();
        let h = (hi.max(lo).max(1) as f64).ln();
        (l + (h - l) * self.unit()).exp().round() as u64
    }

    /// Exponential with mean `mean`, at least 1, at most `max`.
    fn exponential(&mut self, mean: f64, max: u64) -> u64 {
        let u = self.unit().max(1e-12);
        ((-u.ln() * mean).round() as u64).clamp(1, max)
    }
}

/// Parameters of a decoder layer (fp32): attention in/out projections, MLP, two layer norms.
fn decoder_layer_params(b: &mut B, d: u64, ffn: u64, site: &str) -> Vec<T> {
    [
        d * 3 * d,
        3 * d,
        d * d,
        d,
        d * ffn,
        ffn,
        ffn * d,
        d,
        2 * d,
        2 * d,
    ]
    .into_iter()
    .map(|n| b.alloc(n * F32, site))
    .collect()
}

/// One training step of a GPT-2-style decoder on `tokens` tokens (fp32): forward saves what
/// backward needs, backward frees it layer by layer and makes a gradient per parameter (freed
/// by `zero_grad(set_to_none=True)`); AdamW's two states per parameter come at the first step.
fn gpt_step(
    b: &mut B,
    params: &[T],
    adam: &mut Vec<T>,
    layers: u64,
    d: u64,
    vocab: u64,
    tokens: u64,
) {
    let ffn = 4 * d;
    let mut saved: Vec<Vec<T>> = Vec::new();
    let mut x = b.alloc(tokens * d * F32, "embedding (activation)");
    for _ in 0..layers {
        let ln1 = b.alloc(tokens * d * F32, "ln_1 (activation)");
        let qkv = b.alloc(tokens * 3 * d * F32, "attn.c_attn (activation)");
        // Flash attention: the output and its log-sum-exp are saved, no score matrix.
        let att = b.alloc(tokens * d * F32, "attn (activation)");
        let lse = b.alloc(tokens * 12 * F32, "attn lse (activation)");
        let proj = b.alloc(tokens * d * F32, "attn.c_proj (activation)");
        let x2 = b.alloc(tokens * d * F32, "residual (activation)");
        b.free(proj);
        let ln2 = b.alloc(tokens * d * F32, "ln_2 (activation)");
        let fc = b.alloc(tokens * ffn * F32, "mlp.c_fc (activation)");
        let gelu = b.alloc(tokens * ffn * F32, "mlp.gelu (activation)");
        let out = b.alloc(tokens * d * F32, "mlp.c_proj (activation)");
        let x3 = b.alloc(tokens * d * F32, "residual (activation)");
        b.free(out);
        saved.push(vec![x, ln1, qkv, att, lse, x2, ln2, fc, gelu]);
        x = x3;
    }
    let lnf = b.alloc(tokens * d * F32, "ln_f (activation)");
    let logits = b.alloc(tokens * vocab * F32, "lm_head logits");
    let loss = b.alloc(F32, "loss");
    // Backward: the logits' gradient, then each layer in reverse.
    let dlogits = b.alloc(tokens * vocab * F32, "logits grad");
    b.free(logits);
    let mut grads: Vec<T> = Vec::new();
    grads.push(b.alloc(vocab * d * F32, "wte.grad"));
    let mut dx = b.alloc(tokens * d * F32, "activation grad");
    b.free_all([dlogits, lnf, x, loss]);
    let per_layer = params.len().saturating_sub(2) / layers.max(1) as usize;
    for layer in saved.into_iter().rev() {
        for k in 0..per_layer {
            let p = params[2 + k];
            grads.push(b.alloc(p.1, "param.grad"));
        }
        let tmp = b.alloc(tokens * ffn * F32, "mlp grad (temporary)");
        b.free(tmp);
        let ndx = b.alloc(tokens * d * F32, "activation grad");
        b.free(dx);
        dx = ndx;
        b.free_all(layer);
    }
    grads.push(b.alloc(params[1].1, "wpe.grad"));
    b.free(dx);
    adamw_states(b, adam, params);
    b.free_all(grads);
}

/// AdamW's exp_avg and exp_avg_sq per parameter, made at the first optimizer step (`adam`
/// empty until then) and kept.
fn adamw_states(b: &mut B, adam: &mut Vec<T>, params: &[T]) {
    if adam.is_empty() {
        for p in params {
            adam.push(b.alloc(p.1, "optimizer exp_avg"));
            adam.push(b.alloc(p.1, "optimizer exp_avg_sq"));
        }
    }
}

fn gpt_params(b: &mut B, layers: u64, d: u64, vocab: u64, ctx: u64) -> Vec<T> {
    let mut p = vec![
        b.alloc(vocab * d * F32, "wte (parameter)"),
        b.alloc(ctx * d * F32, "wpe (parameter)"),
    ];
    for _ in 0..layers {
        p.extend(decoder_layer_params(
            b,
            d,
            4 * d,
            "decoder layer (parameter)",
        ));
    }
    p
}

/// GPT-2 small trained on batches of 8 sequences of log-uniform length in [64, 1,024] tokens,
/// without padding or packing: each step's token count, and with it every activation, differs.
fn varlen_train(steps: u32, seed: u64) -> Trace {
    const LAYERS: u64 = 12;
    const D: u64 = 768;
    const VOCAB: u64 = 50_257;
    const CTX: u64 = 1_024;
    let mut rng = SplitMix(seed);
    let mut b = B::new();
    let params = gpt_params(&mut b, LAYERS, D, VOCAB, CTX);
    let mut adam = Vec::new();
    for _ in 0..steps {
        let tokens: u64 = (0..8).map(|_| rng.log_uniform(64, CTX)).sum();
        let batch = b.alloc(tokens * 8, "input_ids");
        gpt_step(&mut b, &params, &mut adam, LAYERS, D, VOCAB, tokens);
        b.free(batch);
        b.end_step();
    }
    b.free_all(adam);
    b.free_all(params);
    b.finish(format!("varlen-train-{steps}-{seed}"))
}

/// A request being served: its KV cache, a (K, V) pair per layer, and how many tokens it holds
/// and has left to make.
struct Request {
    kv: Vec<(T, T)>,
    len: u64,
    left: u64,
}

/// TinyLlama-1.1B serving with continuous batching (up to 32 requests at once): requests arrive
/// Poisson (0.5 per decode step), with prompt and output lengths exponential with the ShareGPT
/// means the vLLM paper reports (161 and 338 tokens; Kwon et al. 2023), clipped to the 2,048
/// context. A prefill makes the prompt's activations and KV cache; each decode step makes the
/// batch's activations and grows every active request's K and V by one token per layer as
/// `torch.cat` does (a new tensor one token longer, the old one freed).
fn llm_serve(steps: u32, seed: u64) -> Trace {
    const LAYERS: u64 = 22;
    const D: u64 = 2_048;
    const KV: u64 = 4 * 64;
    const FFN: u64 = 5_632;
    const VOCAB: u64 = 32_000;
    const CTX: u64 = 2_048;
    const SLOTS: usize = 32;
    let mut rng = SplitMix(seed);
    let mut b = B::new();
    let mut params = vec![b.alloc(VOCAB * D * F16, "embed_tokens (parameter)")];
    for _ in 0..LAYERS {
        for n in [D * D, D * KV, D * KV, D * D, 3 * D * FFN, 2 * D] {
            params.push(b.alloc(n * F16, "decoder layer (parameter)"));
        }
    }
    params.push(b.alloc(VOCAB * D * F16, "lm_head (parameter)"));
    let mut active: Vec<Request> = Vec::new();
    // Decode steps: `steps` × 50 (a STEP of the spec ends every 50).
    for decode in 1..=steps as u64 * 50 {
        // Arrivals: Poisson(0.5) by inversion.
        let (mut k, mut p, l) = (0u32, 1.0f64, (-0.5f64).exp());
        loop {
            p *= rng.unit();
            if p <= l {
                break;
            }
            k += 1;
        }
        for _ in 0..k {
            if active.len() >= SLOTS {
                break;
            }
            let prompt = rng.exponential(161.0, CTX / 2);
            let out = rng.exponential(338.0, CTX - prompt);
            // Prefill: per layer the hidden states and MLP of the whole prompt, then its KV.
            let mut kv = Vec::new();
            let h = b.alloc(prompt * D * F16, "prefill hidden");
            for _ in 0..LAYERS {
                let q = b.alloc(prompt * D * F16, "prefill attn (temporary)");
                let k = b.alloc(prompt * KV * F16, "kv cache k");
                let v = b.alloc(prompt * KV * F16, "kv cache v");
                let up = b.alloc(prompt * 2 * FFN * F16, "prefill mlp (temporary)");
                b.free_all([up, q]);
                kv.push((k, v));
            }
            let logits = b.alloc(VOCAB * F32, "prefill logits");
            b.free_all([logits, h]);
            active.push(Request {
                kv,
                len: prompt,
                left: out,
            });
        }
        if active.is_empty() {
            if decode % 50 == 0 {
                b.end_step();
            }
            continue;
        }
        // One decode step for the whole batch.
        let n = active.len() as u64;
        let h = b.alloc(n * D * F16, "decode hidden");
        for layer in 0..LAYERS as usize {
            let q = b.alloc(n * D * F16, "decode attn (temporary)");
            for r in active.iter_mut() {
                let (k, v) = r.kv[layer];
                let k2 = b.alloc((r.len + 1) * KV * F16, "kv cache k (torch.cat)");
                b.free(k);
                let v2 = b.alloc((r.len + 1) * KV * F16, "kv cache v (torch.cat)");
                b.free(v);
                r.kv[layer] = (k2, v2);
            }
            let up = b.alloc(n * 2 * FFN * F16, "decode mlp (temporary)");
            b.free_all([up, q]);
        }
        let logits = b.alloc(n * VOCAB * F32, "decode logits");
        b.free_all([logits, h]);
        for r in active.iter_mut() {
            r.len += 1;
            r.left -= 1;
        }
        // Finished requests leave, their caches with them.
        let mut i = 0;
        while i < active.len() {
            if active[i].left == 0 {
                let r = active.swap_remove(i);
                for (k, v) in r.kv {
                    b.free_all([k, v]);
                }
            } else {
                i += 1;
            }
        }
        if decode % 50 == 0 {
            b.end_step();
        }
    }
    for r in active {
        for (k, v) in r.kv {
            b.free_all([k, v]);
        }
    }
    b.free_all(params);
    b.finish(format!("llm-serve-{steps}-{seed}"))
}

/// A mixture-of-experts decoder trained on 4,096 tokens a step: 6 layers of attention and 8
/// experts (d 768, ffn 2,048), each token routed to 2 of them; the experts' shares of the 8,192
/// routed tokens are Dirichlet(1) each layer and step (a modelling choice for imbalanced
/// routing), so every expert's buffers change size every step.
fn moe_train(steps: u32, seed: u64) -> Trace {
    const LAYERS: u64 = 6;
    const D: u64 = 768;
    const FFN: u64 = 2_048;
    const EXPERTS: usize = 8;
    const TOKENS: u64 = 4_096;
    const VOCAB: u64 = 50_257;
    let mut rng = SplitMix(seed);
    let mut b = B::new();
    let mut params = vec![b.alloc(VOCAB * D * F32, "wte (parameter)")];
    for _ in 0..LAYERS {
        for n in [D * 3 * D, D * D, D * EXPERTS as u64, 2 * D] {
            params.push(b.alloc(n * F32, "attention / router (parameter)"));
        }
        for _ in 0..EXPERTS {
            params.push(b.alloc(2 * D * FFN * F32, "expert (parameter)"));
        }
    }
    let mut adam: Vec<T> = Vec::new();
    for _ in 0..steps {
        let mut saved: Vec<Vec<T>> = Vec::new();
        let mut x = b.alloc(TOKENS * D * F32, "embedding (activation)");
        for _ in 0..LAYERS {
            let mut keep = vec![x];
            keep.push(b.alloc(TOKENS * 3 * D * F32, "attn qkv (activation)"));
            keep.push(b.alloc(TOKENS * D * F32, "attn out (activation)"));
            keep.push(b.alloc(TOKENS * EXPERTS as u64 * F32, "router logits (activation)"));
            // Dirichlet(1) shares: normalised exponentials.
            let e: Vec<f64> = (0..EXPERTS).map(|_| -rng.unit().max(1e-12).ln()).collect();
            let sum: f64 = e.iter().sum();
            for share in e {
                let n = ((share / sum) * 2.0 * TOKENS as f64).round() as u64;
                if n == 0 {
                    continue;
                }
                keep.push(b.alloc(n * D * F32, "expert input (activation)"));
                keep.push(b.alloc(n * FFN * F32, "expert hidden (activation)"));
                let out = b.alloc(n * D * F32, "expert output (temporary)");
                b.free(out);
            }
            saved.push(keep);
            x = b.alloc(TOKENS * D * F32, "moe combine (activation)");
        }
        let logits = b.alloc(TOKENS * VOCAB * F32, "lm_head logits");
        let dlogits = b.alloc(TOKENS * VOCAB * F32, "logits grad");
        b.free(logits);
        let mut grads = vec![b.alloc(params[0].1, "param.grad")];
        let mut dx = b.alloc(TOKENS * D * F32, "activation grad");
        b.free_all([dlogits, x]);
        let per_layer = (params.len() - 1) / LAYERS as usize;
        for (l, layer) in saved.into_iter().enumerate().rev() {
            for k in 0..per_layer {
                grads.push(b.alloc(params[1 + l * per_layer + k].1, "param.grad"));
            }
            let ndx = b.alloc(TOKENS * D * F32, "activation grad");
            b.free(dx);
            dx = ndx;
            b.free_all(layer);
        }
        b.free(dx);
        adamw_states(&mut b, &mut adam, &params);
        b.free_all(grads);
        b.end_step();
    }
    b.free_all(adam);
    b.free_all(params);
    b.finish(format!("moe-train-{steps}-{seed}"))
}

/// GPT-2 medium with DDP on two streams: each step's forward and backward run on stream 0;
/// the gradients fill 25 MiB buckets (`bucket_cap_mb`'s default), made at the first backward
/// and kept; after backward, each bucket's all-reduce takes a 25 MiB buffer on the
/// communication stream (stream 1), allocated and freed there, interleaved with a temporary of
/// the optimizer on stream 0. (DDP overlaps the reduction with backward; here it follows it, so
/// the communication buffers meet the step's freed activations, not its live ones.) Batches are
/// 4 to 8 sequences of 1,024 tokens (uniform), so activations change with the batch size.
fn two_stream_train(steps: u32, seed: u64) -> Trace {
    const LAYERS: u64 = 24;
    const D: u64 = 1_024;
    const VOCAB: u64 = 50_257;
    const CTX: u64 = 1_024;
    const BUCKET: u64 = 25 << 20;
    const COMM: u64 = 1;
    let mut rng = SplitMix(seed);
    let mut b = B::new();
    let params = gpt_params(&mut b, LAYERS, D, VOCAB, CTX);
    let total: u64 = params.iter().map(|p| p.1).sum();
    let mut buckets: Vec<T> = Vec::new();
    let mut adam = Vec::new();
    for _ in 0..steps {
        let tokens = (4 + rng.below(5)) * CTX;
        // Forward and backward as for one device, then the reduction of each bucket on the
        // communication stream, interleaved with the step that follows it.
        gpt_step(&mut b, &params, &mut adam, LAYERS, D, VOCAB, tokens);
        if buckets.is_empty() {
            for _ in 0..total.div_ceil(BUCKET) {
                buckets.push(b.alloc(BUCKET, "ddp bucket"));
            }
        }
        for _ in 0..buckets.len() {
            b.stream = COMM;
            let buf = b.alloc(BUCKET, "allreduce buffer (comm stream)");
            b.stream = 0;
            let tmp = b.alloc(D * D * F32, "optimizer foreach (temporary)");
            b.free(buf);
            b.free(tmp);
        }
        b.end_step();
    }
    b.free_all(buckets);
    b.free_all(adam);
    b.free_all(params);
    b.finish(format!("two-stream-train-{steps}-{seed}"))
}
