// matmul_tensor: matmul_wide's product (same words, grid, 128 x 128 tiles and epilogues) on
// the tensor cores, through cooperative matrices (wgpu's experimental feature; native Vulkan
// only). Compiled after matmul.wgsl with `enable f16; enable wgpu_cooperative_matrix;` in
// front, for `--tensor-cores`: the operands are rounded to f16 as they are staged in workgroup
// memory and every 16 x 16 x 16 block product sums in f32, so results differ from the f32
// kernels by f16 rounding of the operands (about 1e-3 relative), not of the sums.
//
// 256 threads in eight groups of 32 (lid / 32; on a GPU the device is opened for this only
// where every subgroup has 32 invocations, so each group is a subgroup): group g owns rows
// 32 (g / 2) ..+32 and columns 64 (g % 2) ..+64 of the tile, eight 16 x 16 f32 accumulators.
// Where subgroups are smaller (lavapipe's 8, in tests), each of a group's subgroups does the
// group's cooperative loads and products alike and stores the same values. Each step of the
// depth loop stages 32 depths of a and b, loaded two steps before, and multiplies them in
// two halves of 16.

const TC_BK: u32 = 32u;
// A staged tile of 128 lines (a's rows or b's columns) by TC_BK depths lies in workgroup
// memory as it lies in memory: [line][depth] where the depth is contiguous there (`along_k`),
// else [depth][line]. Each run of four elements a thread stages is then four consecutive
// f16s, one vec4<f16> of the tile, stored at once (a subgroup's stores fill whole rows of
// banks; staging a transposed operand into the other layout had up to 16 of a subgroup's
// stores in one bank). The cooperative loads read either layout (row- or column-major),
// their stride counted in vec4s. Each row is 16 bytes longer than its data, so that the
// eight rows a load reads at once start in different banks.
const TC_LINE_PITCH: u32 = 10u; // [line][depth], in vec4s: (TC_BK + 8) / 4
const TC_DEPTH_PITCH: u32 = 34u; // [depth][line], in vec4s: (128 + 8) / 4
var<workgroup> tc_a: array<vec4<f16>, 1280>; // 128 * TC_LINE_PITCH, at least TC_BK * TC_DEPTH_PITCH
var<workgroup> tc_b: array<vec4<f16>, 1280>;
// Each group's 16 x 16 block on its way through the epilogue.
var<workgroup> tc_c: array<f32, 2048>;

// Four operands as the tensor cores take them, f16: rounded to nearest (±inf past f16's
// range, see round_f16), unless they are stored as f16 (`stored_half`: their binding's HALFn)
// and so convert back exactly.
fn f16_operands(x: vec4<f32>, stored_half: bool) -> vec4<f16> {
    if (stored_half) {
        return vec4<f16>(x);
    }
    return vec4<f16>(vec4<f32>(round_f16(x.x), round_f16(x.y), round_f16(x.z), round_f16(x.w)));
}

// A staged operand as thread `lid` holds it between its load and its store: elements
// 4 (256 e + lid) .. + 3 for e in 0..4 of the tile in `staged_at`'s order (matmul.wgsl),
// each run of four consecutive in memory, so that a subgroup's loads read whole runs.
struct Staged { v: array<vec4<f32>, 4> }

// Loads depths k0 .. k0 + 32 of operand `op`'s tile (0: a's 128 rows from i0, 1: b's 128
// columns; see tile_vec4 in matmul.wgsl), zeros outside the product or the chunk.
fn tc_load(op: u32, i0: u32, limit: u32, i_stride: u32, k_stride: u32, k0: u32, k_end: u32, lid: u32) -> Staged {
    let along_k = k_stride == 1u;
    var s: Staged;
    for (var e = 0u; e < 4u; e++) {
        s.v[e] = tile_vec4(op, staged_at(4u * (e * 256u + lid), TC_BK, along_k), along_k, i0, limit, i_stride, k_stride, k0, k_end);
    }
    return s;
}

// One thread's staged elements of a's tile and of b's, between their load and their store.
struct TcPair { a: Staged, b: Staged }

// Both operands' tiles of depth block k0 as thread `lid` stages them (see tc_load); where both
// blocks are whole (`whole_block`), by unchecked loads issued together (`tc_whole`).
fn tc_loads(p: Product, row0: u32, col0: u32, k0: u32, lid: u32) -> TcPair {
    if (whole_block(row0, p.rows, p.a_rs, p.a_cs, k0, p.k_end, TC_BK) && whole_block(col0, p.cols, p.b_cs, p.b_rs, k0, p.k_end, TC_BK)) {
        return TcPair(tc_whole(0u, row0, p.a_rs, p.a_cs, k0, lid), tc_whole(1u, col0, p.b_cs, p.b_rs, k0, lid));
    }
    return TcPair(tc_load(0u, row0, p.rows, p.a_rs, p.a_cs, k0, p.k_end, lid), tc_load(1u, col0, p.cols, p.b_cs, p.b_rs, k0, p.k_end, lid));
}

// tc_load's values of a whole block: four vec4 loads, written out and unchecked (whole_vec4).
fn tc_whole(op: u32, i0: u32, i_stride: u32, k_stride: u32, k0: u32, lid: u32) -> Staged {
    let along_k = k_stride == 1u;
    return Staged(array<vec4<f32>, 4>(
        whole_vec4(op, staged_at(4u * lid, TC_BK, along_k), i0, i_stride, k_stride, k0),
        whole_vec4(op, staged_at(4u * (256u + lid), TC_BK, along_k), i0, i_stride, k_stride, k0),
        whole_vec4(op, staged_at(4u * (512u + lid), TC_BK, along_k), i0, i_stride, k_stride, k0),
        whole_vec4(op, staged_at(4u * (768u + lid), TC_BK, along_k), i0, i_stride, k_stride, k0)));
}

// The vec4 of tc_a or tc_b that holds element (line, depth) of a staged tile and the three
// after it along the contiguous dimension (see TC_LINE_PITCH).
fn tc_at(line: u32, depth: u32, along_k: bool) -> u32 {
    return select(depth * TC_DEPTH_PITCH + line / 4u, line * TC_LINE_PITCH + depth / 4u, along_k);
}

// tc_load's values as f16 into tc_a (a's rows, op 0) or tc_b (b's columns, op 1): each run
// of four one vec4.
fn tc_store_staged(op: u32, s: ptr<function, Staged>, along_k: bool, lid: u32) {
    for (var e = 0u; e < 4u; e++) {
        let t = staged_at(4u * (e * 256u + lid), TC_BK, along_k);
        let at = tc_at(t.x, t.y, along_k);
        if (op == 0u) {
            tc_a[at] = f16_operands((*s).v[e], HALF1);
        } else {
            tc_b[at] = f16_operands((*s).v[e], HALF2);
        }
    }
}

// Whether a's (b's) depths are contiguous in memory: words 5 (a_cs) and 6 (b_rs) are 1. Read
// from the uniform block itself, so that naga knows the result uniform, as a branch around
// cooperative loads must be (`word`'s argument hides that).
fn tc_a_along_k() -> bool {
    return u.w[1].y == 1u;
}

fn tc_b_along_k() -> bool {
    return u.w[1].z == 1u;
}

// a's 16 x 16 block of rows `row` ..+16 (of the tile) and depths `k` ..+16 from tc_a.
fn tc_block_a(row: u32, k: u32) -> coop_mat16x16<f16, A> {
    if (tc_a_along_k()) {
        return coopLoadT<coop_mat16x16<f16, A>>(&tc_a[tc_at(row, k, true)], TC_LINE_PITCH);
    }
    return coopLoad<coop_mat16x16<f16, A>>(&tc_a[tc_at(row, k, false)], TC_DEPTH_PITCH);
}

// b's 16 x 16 block of depths `k` ..+16 and columns `col` ..+16 (of the tile) from tc_b.
fn tc_block_b(k: u32, col: u32) -> coop_mat16x16<f16, B> {
    if (tc_b_along_k()) {
        return coopLoad<coop_mat16x16<f16, B>>(&tc_b[tc_at(col, k, true)], TC_LINE_PITCH);
    }
    return coopLoadT<coop_mat16x16<f16, B>>(&tc_b[tc_at(col, k, false)], TC_DEPTH_PITCH);
}

// Group accumulator (row block r, column block j) through the epilogue: staged in the
// group's part of tc_c, each of its 32 invocations then writes 8 of the 256 elements.
fn tc_store(acc: coop_mat16x16<f32, C>, p: Product, r0: u32, c0: u32, group: u32, lane: u32) {
    coopStoreT(acc, &tc_c[group * 256u], 16u);
    workgroupBarrier();
    for (var e = lane; e < 256u; e += 32u) {
        store_one(r0 + e / 16u, c0 + e % 16u, p.slice, tc_c[group * 256u + e]);
    }
    workgroupBarrier();
}

// Whether the tile goes from the accumulators straight to c (`tc_store_plain`, without
// tc_store's staging and barriers): no epilogue (the flags hold at most F16_OPERANDS), c is
// f32, the tile lies whole in the product and c's rows are whole vec4s. Read from the uniform
// block itself (words 0, 1, 3 and 9), so that naga knows it uniform (see tc_a_along_k).
fn tc_plain_whole(row0: u32, col0: u32) -> bool {
    let w = u.w[0];
    return !HALF3 && (w.w & ~F16_OPERANDS) == 0u && row0 + WIDE <= w.x && col0 + WIDE <= w.y && u.w[2].y % 4u == 0u;
}

@compute @workgroup_size(256)
fn matmul_tensor(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_index) lid: u32) {
    let group = lid / 32u;
    let lane = lid % 32u;
    let p = product(wid.z);
    let row0 = wid.y * WIDE;
    let col0 = wid.x * WIDE;
    // The group's rows and columns within the tile.
    let sr = 32u * (group / 2u);
    let sc = 64u * (group % 2u);
    var c00 = coop_mat16x16<f32, C>(); var c01 = coop_mat16x16<f32, C>();
    var c02 = coop_mat16x16<f32, C>(); var c03 = coop_mat16x16<f32, C>();
    var c10 = coop_mat16x16<f32, C>(); var c11 = coop_mat16x16<f32, C>();
    var c12 = coop_mat16x16<f32, C>(); var c13 = coop_mat16x16<f32, C>();
    // Two depth blocks ahead of the one multiplied are in flight, in two register stages
    // that take turns (`odd`), so that a block's loads have two blocks' products to arrive in.
    // (Separate variables, not TcPairs: naga 30's SPIR-V writer panics on a pointer to a
    // member.)
    var a0: Staged;
    var b0: Staged;
    var a1: Staged;
    var b1: Staged;
    {
        let loaded = tc_loads(p, row0, col0, p.k_begin, lid);
        a0 = loaded.a;
        b0 = loaded.b;
    }
    if (p.k_begin + TC_BK < p.k_end) {
        let loaded = tc_loads(p, row0, col0, p.k_begin + TC_BK, lid);
        a1 = loaded.a;
        b1 = loaded.b;
    }
    var odd = false;
    for (var k0 = p.k_begin; k0 < p.k_end; k0 += TC_BK) {
        if (odd) {
            tc_store_staged(0u, &a1, tc_a_along_k(), lid);
            tc_store_staged(1u, &b1, tc_b_along_k(), lid);
        } else {
            tc_store_staged(0u, &a0, tc_a_along_k(), lid);
            tc_store_staged(1u, &b0, tc_b_along_k(), lid);
        }
        workgroupBarrier();
        if (k0 + 2u * TC_BK < p.k_end) {
            let loaded = tc_loads(p, row0, col0, k0 + 2u * TC_BK, lid);
            if (odd) {
                a1 = loaded.a;
                b1 = loaded.b;
            } else {
                a0 = loaded.a;
                b0 = loaded.b;
            }
        }
        odd = !odd;
        for (var kk = 0u; kk < TC_BK; kk += 16u) {
            let a0 = tc_block_a(sr, kk);
            let a1 = tc_block_a(sr + 16u, kk);
            let b0 = tc_block_b(kk, sc);
            let b1 = tc_block_b(kk, sc + 16u);
            let b2 = tc_block_b(kk, sc + 32u);
            let b3 = tc_block_b(kk, sc + 48u);
            c00 = coopMultiplyAdd(a0, b0, c00); c01 = coopMultiplyAdd(a0, b1, c01);
            c02 = coopMultiplyAdd(a0, b2, c02); c03 = coopMultiplyAdd(a0, b3, c03);
            c10 = coopMultiplyAdd(a1, b0, c10); c11 = coopMultiplyAdd(a1, b1, c11);
            c12 = coopMultiplyAdd(a1, b2, c12); c13 = coopMultiplyAdd(a1, b3, c13);
        }
        workgroupBarrier();
    }
    let r0 = row0 + sr;
    let r1 = r0 + 16u;
    let c0 = col0 + sc;
    if (tc_plain_whole(row0, col0)) {
        let c_rs = u.w[2].y;
        let top = p.slice + r0 * c_rs + c0;
        let bottom = top + 16u * c_rs;
        tc_store_plain(c00, top, c_rs); tc_store_plain(c01, top + 16u, c_rs);
        tc_store_plain(c02, top + 32u, c_rs); tc_store_plain(c03, top + 48u, c_rs);
        tc_store_plain(c10, bottom, c_rs); tc_store_plain(c11, bottom + 16u, c_rs);
        tc_store_plain(c12, bottom + 32u, c_rs); tc_store_plain(c13, bottom + 48u, c_rs);
        return;
    }
    tc_store(c00, p, r0, c0, group, lane); tc_store(c01, p, r0, c0 + 16u, group, lane);
    tc_store(c02, p, r0, c0 + 32u, group, lane); tc_store(c03, p, r0, c0 + 48u, group, lane);
    tc_store(c10, p, r1, c0, group, lane); tc_store(c11, p, r1, c0 + 16u, group, lane);
    tc_store(c12, p, r1, c0 + 32u, group, lane); tc_store(c13, p, r1, c0 + 48u, group, lane);
}
