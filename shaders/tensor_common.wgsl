// What the tensor-core kernels (matmul_tensor.wgsl, attention_tensor.wgsl) share: alpha-gpu
// places it after the file each is compiled with (matmul.wgsl, attention.wgsl).

// x as the tensor cores take it, an f16 operand: rounded to nearest (±inf past f16's range,
// see round_f16), unless it is stored as f16 (`stored_half`: its binding's HALFn) and so
// converts back exactly.
fn f16_operand(x: f32, stored_half: bool) -> f16 {
    if (stored_half) {
        return f16(x);
    }
    return f16(round_f16(x));
}
