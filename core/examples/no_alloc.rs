//! Training and sampling with no allocator at all: alpha-core without features, every buffer
//! (parameters, gradients, AdamW moments, activations, tapes, tokens, the KV cache) cut from
//! one `static` arena whose size the plans are checked against at start. The same program
//! runs on the host and on a Cortex-M4F (`thumbv7em-none-eabihf`, under QEMU's `mps2-an386`
//! board, output through semihosting).
//!
//! Host: `cargo run --release -p alpha-core --example no_alloc` (it counts the allocator's
//! calls while the model trains and samples, and fails unless there are none).
//! Bare metal: `scripts/no-alloc-arm.sh` builds it for the Cortex-M4F and runs it in QEMU.
#![no_std]
#![cfg_attr(target_os = "none", no_main)]

use alpha_core::model::{generate, init_params, kv_cache_len, DecodingMemory, SamplingConfig, SamplingMemory};
use alpha_core::optim::{AdamWConfig, LrSchedule};
use alpha_core::tape::{self, Op};
use alpha_core::tokenizer::CharTokenizer;
use alpha_core::train::{Memory, TrainConfig, Trainer};
use alpha_core::{Arch, GptConfig, Llama, Plan, Rng, Serial};
use core::fmt::Write;
use core::sync::atomic::{AtomicBool, Ordering};

/// What the model learns: a verse, seen twice in a row (so that windows cross from its end to
/// its start).
const TEXT: &str = "The quality of mercy is not strained; it droppeth as the gentle rain from heaven upon the place beneath. It is twice blest: it blesseth him that gives and him that takes.\n";
const BATCH: usize = 4;
const SEQ: usize = 32;
const STEPS: u64 = 300;
/// The most distinct characters the vocabulary may hold.
const MAX_CHARS: usize = 64;

/// Every buffer of the run. Its sizes are constants a build fixes; `run` checks them against
/// the plans before it touches anything. The numbers and token ids start as zeros (`.bss`,
/// no space in the image); the ops start as blanks (`.data`).
struct Arena {
    floats: &'static mut [f32; 400_000],
    ops: &'static mut [Op; 160],
    tokens: &'static mut [u32; 1024],
}

/// The arena, borrowed once for the program's life.
fn take_arena() -> Arena {
    static mut FLOATS: [f32; 400_000] = [0.0; 400_000];
    static mut OPS: [Op; 160] = [Op::BLANK; 160];
    static mut TOKENS: [u32; 1024] = [0; 1024];
    static TAKEN: AtomicBool = AtomicBool::new(false);
    assert!(!TAKEN.swap(true, Ordering::Relaxed), "the arena is taken once");
    // SAFETY: the flag above hands out these references only once.
    unsafe { Arena { floats: &mut *core::ptr::addr_of_mut!(FLOATS), ops: &mut *core::ptr::addr_of_mut!(OPS), tokens: &mut *core::ptr::addr_of_mut!(TOKENS) } }
}

/// A Llama-family model (RMSNorm, rotary positions, SwiGLU, two query heads sharing one
/// key/value head) of `vocab` characters.
fn config(vocab: usize) -> GptConfig {
    let llama = Llama { n_kv_head: 1, intermediate_size: 48, norm_eps: 1e-5, rope_theta: 10000.0, rope_scaling: None, qkv_bias: false, tied: true };
    GptConfig { arch: Arch::Llama(llama), ..GptConfig::gpt2(vocab, SEQ, 2, 2, 24) }
}

/// The sorted, unique characters of `text`, in a fixed array.
fn characters(text: &str) -> Result<([char; MAX_CHARS], usize), &'static str> {
    let (mut chars, mut n) = (['\0'; MAX_CHARS], 0);
    for ch in text.chars() {
        if let Err(at) = chars[..n].binary_search(&ch) {
            if n == MAX_CHARS {
                return Err("the text has more distinct characters than MAX_CHARS");
            }
            chars.copy_within(at..n, at + 1);
            chars[at] = ch;
            n += 1;
        }
    }
    Ok((chars, n))
}

/// Splits `len` elements off the front of `rest`.
fn cut<'a, T>(rest: &mut &'a mut [T], len: usize) -> &'a mut [T] {
    let (head, tail) = core::mem::take(rest).split_at_mut(len);
    *rest = tail;
    head
}

/// Trains the model on [`TEXT`], then samples from it, writing progress to `out`. An error
/// where the arena is too small for the plans or the loss does not fall.
fn run(out: &mut dyn Write) -> Result<(), &'static str> {
    let (chars, n_chars) = characters(TEXT)?;
    let tokenizer = CharTokenizer::new(&chars[..n_chars]).map_err(|_| "the characters are sorted and unique")?;
    let config = config(tokenizer.vocab_size());
    let train_plan = Plan::new(config, BATCH, SEQ).map_err(|_| "the training plan is valid")?;
    let sample_plan = Plan::new(config, 1, SEQ).map_err(|_| "the sampling plan is valid")?;
    let token_plan = Plan::new(config, 1, 1).map_err(|_| "the one-token plan is valid")?;

    // What the plans need, against what the arena holds.
    let p = train_plan.params_len();
    let floats = 4 * p + train_plan.acts_len() + sample_plan.acts_len() + token_plan.acts_len() + kv_cache_len(&sample_plan);
    let ops = tape::tape_len(&train_plan) + tape::tape_len(&sample_plan) + tape::tape_len(&token_plan);
    let tokens = 2 * train_plan.tokens() + 2 * TEXT.chars().count() + SEQ;
    let arena = take_arena();
    let _ = writeln!(out, "model: {p} parameters, batch {BATCH} of {SEQ} tokens");
    let (held_floats, held_ops, held_tokens) = (arena.floats.len(), arena.ops.len(), arena.tokens.len());
    let _ = writeln!(out, "arena: {floats} of {held_floats} floats, {ops} of {held_ops} ops, {tokens} of {held_tokens} token ids");
    if floats > held_floats || ops > held_ops || tokens > held_tokens {
        return Err("the static arena is smaller than the plans need: raise its sizes");
    }

    let (mut f, mut o, mut t) = (&mut arena.floats[..], &mut arena.ops[..], &mut arena.tokens[..]);
    let train_tape = tape::record(&train_plan, cut(&mut o, tape::tape_len(&train_plan))).map_err(|_| "the tape fits")?;
    let sample_tape = tape::record(&sample_plan, cut(&mut o, tape::tape_len(&sample_plan))).map_err(|_| "the tape fits")?;
    let token_tape = tape::record(&token_plan, cut(&mut o, tape::tape_len(&token_plan))).map_err(|_| "the tape fits")?;
    let ids = cut(&mut t, 2 * TEXT.chars().count());
    let (once, twice) = ids.split_at_mut(ids.len() / 2);
    tokenizer.encode(TEXT, once).map_err(|_| "the text's characters are the vocabulary")?;
    twice.copy_from_slice(once);

    let params = cut(&mut f, p);
    init_params(&train_plan, params, &mut Rng::new(42));
    let mem = Memory {
        params,
        grads: cut(&mut f, p),
        adam_m: cut(&mut f, p),
        adam_v: cut(&mut f, p),
        acts: cut(&mut f, train_plan.acts_len()),
        batch: cut(&mut t, 2 * train_plan.tokens()),
    };
    let cfg = TrainConfig {
        schedule: LrSchedule { max_lr: 1e-2, min_lr: 1e-3, warmup_iters: 10, decay_iters: STEPS },
        adamw: AdamWConfig::default(),
        grad_clip: 1.0,
        grad_accum: 1,
    };
    let mut trainer = Trainer::new(train_plan, train_tape, mem, cfg, Rng::new(7)).map_err(|_| "the memory matches the plan")?;
    let (mut first, mut last) = (0.0, 0.0);
    for step in 1..=STEPS {
        let stats = trainer.train_step(&Serial, &*ids).map_err(|_| "the loss is finite")?;
        last = stats.loss;
        if step == 1 {
            first = last;
        }
        if step == 1 || step % 50 == 0 {
            let _ = writeln!(out, "step {step:3}: loss {last:.3}");
        }
    }
    if last > 0.5 * first {
        return Err("the loss did not halve");
    }

    // Sampling: the batch-1 window's plan, and the one-token plan against a KV cache.
    let (token_acts, cache) = (cut(&mut f, token_plan.acts_len()), cut(&mut f, kv_cache_len(&sample_plan)));
    let decoding = DecodingMemory { plan: &token_plan, tape: token_tape, acts: token_acts, cache };
    let (acts, window) = (cut(&mut f, sample_plan.acts_len()), cut(&mut t, SEQ));
    let mem = SamplingMemory { plan: &sample_plan, tape: sample_tape, acts, window, decoding: Some(decoding) };
    let prompt = "The quality";
    let mut prompt_ids = [0u32; 16];
    let n = tokenizer.encode(prompt, &mut prompt_ids).map_err(|_| "the prompt's characters are the vocabulary")?;
    let sampling = SamplingConfig { temperature: 0.5, top_k: 8, top_p: 0.95, ..SamplingConfig::new(80) };
    let _ = write!(out, "sample: {prompt}");
    generate(&Serial, mem, trainer.mem.params, &prompt_ids[..n], &sampling, &mut Rng::new(1), |id| {
        let _ = out.write_char(tokenizer.decode(id).unwrap_or('?'));
    });
    let _ = writeln!(out);
    Ok(())
}

/// The host: std for output and exit codes only, and an allocator that counts its calls.
#[cfg(not(target_os = "none"))]
mod host {
    extern crate std;
    use core::sync::atomic::{AtomicUsize, Ordering};
    use std::alloc::{GlobalAlloc, Layout, System};
    use std::io::Write as _;

    /// The system allocator, counting allocations.
    struct Counting;
    static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

    // SAFETY: every call is forwarded to the system allocator unchanged.
    unsafe impl GlobalAlloc for Counting {
        unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: the caller's contract is `System.alloc`'s.
            unsafe { System.alloc(layout) }
        }
        unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
            // SAFETY: as above.
            unsafe { System.dealloc(ptr, layout) }
        }
        unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
            ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
            // SAFETY: as above.
            unsafe { System.realloc(ptr, layout, new_size) }
        }
    }

    #[global_allocator]
    static GLOBAL: Counting = Counting;

    /// Standard output through a lock taken per write (no buffer of its own).
    struct Stdout;
    impl core::fmt::Write for Stdout {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            std::io::stdout().lock().write_all(s.as_bytes()).map_err(|_| core::fmt::Error)
        }
    }

    pub fn main() {
        // Standard output's own buffer is allocated on its first use: before the count.
        std::println!("alpha-core without an allocator, on the host");
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        let result = super::run(&mut Stdout);
        let allocations = ALLOCATIONS.load(Ordering::Relaxed) - before;
        let failure = match result {
            Err(e) => e,
            Ok(()) if allocations > 0 => "the run called the allocator",
            Ok(()) => {
                std::println!("allocations during the run: 0");
                return;
            }
        };
        std::eprintln!("error: {failure} (allocations during the run: {allocations})");
        std::process::exit(1);
    }
}

#[cfg(not(target_os = "none"))]
fn main() {
    host::main()
}

/// The Cortex-M4F: a vector table and reset handler (FPU on, `.bss` zeroed, `.data` copied;
/// the memory layout is `no_alloc.ld`), output and exit through Arm semihosting.
#[cfg(target_os = "none")]
mod bare_metal {
    use core::arch::{asm, global_asm};
    use core::fmt::Write;

    global_asm!(
        r#"
        .section .vector_table, "a"
        .word _stack_top
        .word reset
        .rept 14
        .word fault
        .endr

        .section .text.reset, "ax"
        .global reset
        .type reset, %function
        .thumb_func
    reset:
        ldr r0, =0xE000ED88
        ldr r1, [r0]
        orr r1, r1, #(0xF << 20)
        str r1, [r0]
        dsb
        isb
        ldr r0, =__sbss
        ldr r1, =__ebss
        movs r2, #0
    1:  cmp r0, r1
        bhs 2f
        str r2, [r0], #4
        b 1b
    2:  ldr r0, =__sdata
        ldr r1, =__edata
        ldr r2, =__sidata
    3:  cmp r0, r1
        bhs 4f
        ldr r3, [r2], #4
        str r3, [r0], #4
        b 3b
    4:  bl bare_main
        b 4b

        .type fault, %function
        .thumb_func
    fault:
        bl bare_fault
        b fault
    "#
    );

    const SYS_WRITE0: usize = 0x04;
    const SYS_EXIT: usize = 0x18;
    /// SYS_EXIT's reasons: the application exited (QEMU exits 0), an unknown run-time error
    /// (QEMU exits 1).
    const EXIT_SUCCESS: usize = 0x20026;
    const EXIT_FAILURE: usize = 0x20024;

    fn semihost(op: usize, arg: usize) {
        // SAFETY: a semihosting call; the debugger (QEMU) reads `arg` as `op` defines.
        unsafe { asm!("bkpt #0xab", inout("r0") op => _, in("r1") arg, options(nostack)) };
    }

    fn exit(reason: usize) -> ! {
        loop {
            semihost(SYS_EXIT, reason);
        }
    }

    /// The host's console, through NUL-terminated chunks.
    struct Console;
    impl Write for Console {
        fn write_str(&mut self, s: &str) -> core::fmt::Result {
            for chunk in s.as_bytes().chunks(63) {
                let mut line = [0u8; 64];
                line[..chunk.len()].copy_from_slice(chunk);
                semihost(SYS_WRITE0, line.as_ptr() as usize);
            }
            Ok(())
        }
    }

    #[no_mangle]
    extern "C" fn bare_main() -> ! {
        let _ = writeln!(Console, "alpha-core without an allocator, on a Cortex-M4F");
        match super::run(&mut Console) {
            Ok(()) => exit(EXIT_SUCCESS),
            Err(e) => {
                let _ = writeln!(Console, "error: {e}");
                exit(EXIT_FAILURE)
            }
        }
    }

    #[no_mangle]
    extern "C" fn bare_fault() -> ! {
        let _ = writeln!(Console, "error: a processor fault");
        exit(EXIT_FAILURE)
    }

    #[panic_handler]
    fn panic(info: &core::panic::PanicInfo) -> ! {
        let _ = writeln!(Console, "error: {info}");
        exit(EXIT_FAILURE)
    }
}
