//! The modelled training loop behind `torch-arena demo --model` and the demo trace
//! (`scripts/make-demo-trace` records it through the plugin's `trace:PATH` recorder): a
//! workload beside the synthetic traces of [`super::synth`], but run through a [`TorchArena`]
//! directly rather than written as events.

use torch_arena::allocator::TorchArena;
use torch_arena::error::Error;

/// A GPT-style model: 12 layers of width 768, batch 8, a sequence length that changes every step
/// (as with packed or variable-length batches), fp32 weights, Adam state, and activations kept
/// for backward. Sizes follow the tensor shapes of such a model; the order follows autograd:
/// forward allocates activations layer by layer, backward frees them in reverse while allocating
/// gradients, the optimizer step allocates temporaries.
pub struct TrainingLoop<'a> {
    arena: &'a TorchArena,
    params: Vec<(u64, usize)>,
    state: Vec<(u64, usize)>,
    rng: u64,
}

const LAYERS: usize = 12;
const WIDTH: usize = 768;
const BATCH: usize = 8;
const VOCAB: usize = 50_304;
const STREAM: u64 = 0;

impl<'a> TrainingLoop<'a> {
    /// The model's parameters and Adam state, allocated through `arena` (device 0, stream 0).
    pub fn new(arena: &'a TorchArena) -> Result<Self, Error> {
        let mut me = TrainingLoop {
            arena,
            params: Vec::new(),
            state: Vec::new(),
            rng: 0x9e37_79b9_7f4a_7c15,
        };
        let mut shapes = vec![VOCAB * WIDTH, 1024 * WIDTH];
        for _ in 0..LAYERS {
            shapes.extend([
                3 * WIDTH * WIDTH,
                3 * WIDTH,
                WIDTH * WIDTH,
                WIDTH,
                4 * WIDTH * WIDTH,
                4 * WIDTH,
            ]);
            shapes.extend([WIDTH * 4 * WIDTH, WIDTH, WIDTH, WIDTH, WIDTH, WIDTH]);
        }
        for n in shapes {
            let bytes = n * 4;
            me.params.push((me.alloc(bytes)?, bytes));
            // Adam: exp_avg and exp_avg_sq, created on the first step in real runs; up front here.
            for _ in 0..2 {
                me.state.push((me.alloc(bytes)?, bytes));
            }
        }
        Ok(me)
    }

    fn alloc(&self, bytes: usize) -> Result<u64, Error> {
        self.arena.malloc(bytes, 0, STREAM)
    }

    fn free(&self, (ptr, bytes): (u64, usize)) -> Result<(), Error> {
        self.arena.free(ptr, bytes, 0, STREAM)
    }

    fn next(&mut self) -> u64 {
        self.rng ^= self.rng << 13;
        self.rng ^= self.rng >> 7;
        self.rng ^= self.rng << 17;
        self.rng
    }

    /// One training step; returns the number of alloc/free calls it made.
    pub fn step(&mut self, _step: u32) -> Result<u64, Error> {
        let seq = 128 * (1 + (self.next() % 8) as usize);
        let tokens = BATCH * seq;
        let mut ops = 0u64;
        let mut saved: Vec<(u64, usize)> = Vec::new();
        let mut transient: Vec<(u64, usize)> = Vec::new();
        let take = |me: &Self, bytes: usize, keep: bool, saved: &mut Vec<_>, tr: &mut Vec<_>| {
            let a = (me.alloc(bytes)?, bytes);
            if keep {
                saved.push(a)
            } else {
                tr.push(a)
            }
            Ok::<_, Error>(())
        };
        // Forward: embeddings, then per layer the tensors autograd keeps, and short-lived ones.
        take(self, tokens * WIDTH * 4, true, &mut saved, &mut transient)?;
        for _ in 0..LAYERS {
            for (bytes, keep) in [
                (tokens * WIDTH * 4, true),          // layer-norm output
                (tokens * 3 * WIDTH * 4, true),      // qkv
                (BATCH * 12 * seq * seq * 4, true),  // attention scores
                (BATCH * 12 * seq * seq * 4, false), // softmax temporary
                (tokens * WIDTH * 4, true),          // attention output
                (tokens * 4 * WIDTH * 4, true),      // mlp hidden
                (tokens * 4 * WIDTH * 4, false),     // gelu temporary
                (tokens * WIDTH * 4, true),          // residual
                (tokens * 8, false),                 // layer-norm statistics
            ] {
                take(self, bytes, keep, &mut saved, &mut transient)?;
                ops += 1;
            }
            for t in transient.drain(..) {
                self.free(t)?;
                ops += 1;
            }
        }
        let logits = (self.alloc(tokens * VOCAB * 4)?, tokens * VOCAB * 4);
        let loss = (self.alloc(4)?, 4);
        ops += 2;
        // Backward: gradients of activations flow back; saved tensors die in reverse order.
        self.free(logits)?;
        let mut grads = Vec::new();
        let mut grad_act = (self.alloc(tokens * WIDTH * 4)?, tokens * WIDTH * 4);
        ops += 2;
        while let Some(t) = saved.pop() {
            let g = (self.alloc(t.1)?, t.1);
            self.free(t)?;
            self.free(std::mem::replace(&mut grad_act, g))?;
            ops += 3;
        }
        self.free(grad_act)?;
        for &(_, bytes) in &self.params {
            grads.push((self.alloc(bytes)?, bytes));
            ops += 1;
        }
        // Optimizer: a temporary per parameter, then the gradients are released (zero_grad).
        for &(_, bytes) in &self.params {
            let tmp = (self.alloc(bytes)?, bytes);
            self.free(tmp)?;
            ops += 2;
        }
        for g in grads {
            self.free(g)?;
            ops += 1;
        }
        self.free(loss)?;
        Ok(ops + 1)
    }
}
