//! Any bytes given to the checkpoint parser: it returns a checkpoint or an error, never
//! panics, and what it accepts is consistent (the arenas have the plan's length).
#![no_main]

use alpha_core::checkpoint::from_bytes;
use alpha_core::Plan;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(ck) = from_bytes(data) {
        let plan = Plan::new(ck.config, 1, 1).expect("an accepted config plans");
        assert_eq!(ck.params.len(), plan.params_len());
        assert_eq!(ck.tokenizer.vocab_size(), ck.config.vocab_size);
        if let Some((m, v, _)) = &ck.optimizer {
            assert_eq!((m.len(), v.len()), (plan.params_len(), plan.params_len()));
        }
    }
});
