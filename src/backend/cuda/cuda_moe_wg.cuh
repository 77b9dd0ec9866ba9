/*
 * cuda_moe_wg.cuh — the routed-expert grouped GEMM on Hopper's warpgroup
 * MMA (k_moe_wg, sm_90a), opt-in through DSV4_CUDA_MOE_WG (issue 7;
 * bench/results/2026-12-01-moe-wgmma-h200.md). Included once, by
 * cuda_moe.cu, after Fp4Args, moe_h, the FP4_* modes, MoeGemmLaunch and the
 * cp.async helpers it uses: one translation unit, kept in its own file so
 * that cuda_moe.cu stays readable.
 */
#ifndef DSV4_CUDA_MOE_WG_CUH
#define DSV4_CUDA_MOE_WG_CUH

/* ------------------------------------------------ grouped GEMM, warpgroup MMA */

/*
 * k_moe_wg: the grouped expert GEMM on Hopper's warpgroup MMA (sm_90a only;
 * issue 7). Why: k_moe_gemm feeds mma.sync from registers and is issue bound
 * (255 registers, ~17 % of FP16 peak); wgmma.mma_async runs a 64 x BN x 32
 * E4M3 product per instruction with the activations read by the tensor
 * cores straight from shared memory.
 *
 * Block = 2 warpgroups (256 threads) on 128 weight rows x BN token rows.
 * GATEUP: warpgroup 0 takes w1's 64 rows, warpgroup 1 w3's same 64 rows
 * (SwiGLU in the epilogue, u handed over through shared memory); DOWN: the
 * two warpgroups take rows 0..63 and 64..127. The expert's rows, per k32
 * step: A = the weights FROM REGISTERS (warp w of a warpgroup owns 16 rows:
 * its 16-row upload tile, the FP4 bytes staged in shared memory as in
 * k_moe_gemm, E2M1 -> E4M3 by the exact bit move (x 2^-6)); B = the BN
 * gathered activation rows, K-major in shared memory with the 128-byte
 * swizzle (a 128-column chunk is one 128-byte row: 16-byte piece p of row r
 * sits at r*128 + ((p ^ (r & 7)) << 4)), named by a matrix descriptor
 * (FP16 form: the FP16 copy of that tile, two 128-byte rows per token).
 *
 * The upload tile gives lane (g, t) row g's columns 8t..8t+7 of a k32 step
 * (cuda_weights.cu), while wgmma's A fragment (the PTX ISA's m64nNk32
 * 8-bit layout, that of mma.m16n8k32 per warp) wants columns 4t..4t+3 and
 * 16+4t..16+4t+3; B in shared memory is in column order. So after the bit
 * move each lane forms its columns 8t+0..3 and 8t+4..7 as two E4M3 words
 * and two shuffles within the quad hand every lane its two words (each
 * source lane offers one word per shuffle: lanes t<2 offer 0..3 first,
 * t>=2 offer 4..7 first).
 *
 * Scales (spec/MODEL.md §2.3/§2.4, as k_moe_gemm's PART form): each k32
 * step's MMA runs into a fresh accumulator d; part += d * w_scale(row, k32)
 * * 2^6; after the 128-column chunk acc += part * x_scale(token, chunk).
 *
 * Two forms (measured on H200, bench/results/2026-12-01-moe-wgmma-h200.md):
 *  - FP8 (e4m3 x e4m3, k32): the fastest (whole MoE op at 8192 tokens
 *    11.2 ms vs 14.4 ms), but NOT k_moe_gemm's numbers: the FP8 tensor-core
 *    path of Hopper sums each k32 product in reduced precision (the limited
 *    FP8 accumulation the DeepSeek-V3 report describes; inferred, not
 *    isolated: the FP16 form below shares the tile, fragment, descriptor
 *    and scale code and matches k_moe_gemm bit for bit), and the second
 *    E4M3 quantisation (of H) amplifies that to ~1e-3 at the op (1.3e-3
 *    from the reference vs 1.5e-5 for k_moe_gemm). Every FP8 variant gives
 *    the same bits, whatever the tile shape.
 *  - FP16 (k16 x 2, fp32 accumulation): the B tile is converted E4M3 ->
 *    FP16 in shared memory once per chunk, in the k order of the A
 *    fragments fp4x8_to_f16 yields (so the A side needs no exchange): the
 *    same HMMA inputs in the same k split as k_moe_gemm's F16 form, and the
 *    outputs are k_moe_gemm's bit for bit (measured, n = 64..8192). Slower
 *    than k_moe_gemm as it stands (17.2 ms at 8192): the conversion pass and
 *    its second barrier per chunk, and twice the MMA instructions.
 * Each step's MMA is waited for at once (wait_group 0), the two warpgroups
 * of a block, and two blocks per SM at BN = 64, overlapping each other's
 * scale FFMAs; PIPE keeps two accumulators (step s+1 in flight while step
 * s is scaled) at one block per SM, which measured slower.
 */
#define WG_STAGES 4
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define MOE_WG_DEVICE 1
/* Issue (fence, mma, commit; no wait): d = A·B, FP8 k32 or FP16 2 x k16 (fp32 accumulation). */
__device__ __forceinline__ void wg_fp8_n64(float (&d)[32], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\nwgmma.fence.sync.aligned;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %36, p, 1, 1;\n"
                 "wgmma.commit_group.sync.aligned;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(0)
                 : "memory");
}
__device__ __forceinline__ void wg_fp8_n128(float (&d)[64], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                          uint64_t desc) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\nwgmma.fence.sync.aligned;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %68, p, 1, 1;\n"
                 "wgmma.commit_group.sync.aligned;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc), "r"(0)
                 : "memory");
}
__device__ __forceinline__ void wg_f16_n64(float (&d)[32], const uint32_t (&a)[8], uint64_t desc0, uint64_t desc1) {
    asm volatile("{\n.reg .pred p, q;\nsetp.ne.b32 p, %42, 0;\nsetp.ne.b32 q, %43, 0;\n"
                 "wgmma.fence.sync.aligned;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%32,%33,%34,%35}, %40, p, 1, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}, "
                 "{%36,%37,%38,%39}, %41, q, 1, 1, 0;\n"
                 "wgmma.commit_group.sync.aligned;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]), "r"(a[6]), "r"(a[7]),
                   "l"(desc0), "l"(desc1), "r"(0), "r"(1)
                 : "memory");
}
__device__ __forceinline__ void wg_f16_n128(float (&d)[64], const uint32_t (&a)[8], uint64_t desc0, uint64_t desc1) {
    asm volatile("{\n.reg .pred p, q;\nsetp.ne.b32 p, %74, 0;\nsetp.ne.b32 q, %75, 0;\n"
                 "wgmma.fence.sync.aligned;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%64,%65,%66,%67}, %72, p, 1, 1, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16 "
                 "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,"
                 "%16,%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
                 "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%47,"
                 "%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%62,%63}, "
                 "{%68,%69,%70,%71}, %73, q, 1, 1, 0;\n"
                 "wgmma.commit_group.sync.aligned;\n}\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
                   "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
                   "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                   "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
                   "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
                   "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                   "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
                   "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(a[4]), "r"(a[5]), "r"(a[6]), "r"(a[7]),
                   "l"(desc0), "l"(desc1), "r"(0), "r"(1)
                 : "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
/* after a wait: the accumulator registers are read only below this point (the compiler sees a def) */
template <int R> __device__ __forceinline__ void wg_reg_fence(float (&d)[R]) {
#pragma unroll
    for (int i = 0; i < R; i++) asm volatile("" : "+f"(d[i])::"memory");
}
/* Shared-memory matrix descriptor (PTX ISA "matrix descriptor"): K-major,
 * 128-byte swizzle, 8-row groups 1024 bytes apart (stride byte offset);
 * the leading byte offset is unused for this layout. */
__device__ __forceinline__ uint64_t wg_desc(const void *p) {
    const uint32_t s = (uint32_t)__cvta_generic_to_shared(p);
    return (uint64_t)((s & 0x3ffffu) >> 4) | (uint64_t)1 << 16 | (uint64_t)(1024 >> 4) << 32 | (uint64_t)1 << 62;
}
#endif

/* The host may launch k_moe_wg only where its body exists: a build with
 * sm_90a code (CMake defines DSV4_CUDA_SM90A when DSV4_CUDA_ARCHS names
 * 90a) on a compute capability 9.0 device. */
#if defined(DSV4_CUDA_SM90A)
#define MOE_WG_HOST 1
#else
#define MOE_WG_HOST 0
#endif

template <int BN, bool F16> __host__ __device__ constexpr int wg_stage() { return (BN * 128 + 8 * 1024 + 8 * 64 + BN * 4 + 1023) / 1024 * 1024; }
template <int BN, bool F16> __host__ __device__ constexpr size_t wg_smem() {
    return (size_t)WG_STAGES * wg_stage<BN, F16>() + (F16 ? (size_t)BN * 256 : 0) + 1024; /* + alignment slack */
}

template <int MODE, int BN, bool F16, bool PIPE>
__global__ void __launch_bounds__(256, BN == 64 && !PIPE ? 2 : 1) k_moe_wg(Fp4Args a, const int *__restrict__ tiles) {
#if defined(MOE_WG_DEVICE)
    constexpr int SB = BN * 128, SA = 8 * 1024, SAS = 8 * 64, NR = BN / 2;
    constexpr int STAGE = wg_stage<BN, F16>();
    extern __shared__ __align__(1024) uint8_t smraw[];
    /* the swizzle pattern is a function of the address: stages 1024-aligned */
    uint8_t *sm = smraw + ((1024u - ((uint32_t)__cvta_generic_to_shared(smraw) & 1023u)) & 1023u);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, wg = warp >> 2, w4 = warp & 3;
    const int g = lane >> 2, t = lane & 3;
    pdl_trigger();
    pdl_wait(); /* the tile list and x come from the previous kernels */
    if ((int)blockIdx.y >= tiles[0]) return;
    const int tv = tiles[1 + blockIdx.y], slot = tv & 0xffff, nb = tv >> 16;
    const int e = a.act_exp[slot], off = a.act_off[slot] + nb * BN;
    const int cnt = min(BN, a.act_off[slot + 1] - off), C = a.K >> 7;

    /* weight tile of shared slot i (0..7): GATEUP w1 tiles 4bx+i, then w3's; DOWN 8bx+i */
    auto wtile = [&](int i, const uint8_t *&W, const uint8_t *&S) {
        if (MODE == FP4_GATEUP) {
            W = i >= 4 ? a.w3 : a.w1;
            S = i >= 4 ? a.s3 : a.s1;
            return (int)blockIdx.x * 4 + (i & 3);
        }
        W = a.w1;
        S = a.s1;
        return (int)blockIdx.x * 8 + i;
    };
    const uint8_t *asrc[2];
    int adst[2];
    const int q = tid & 63;
#pragma unroll
    for (int j = 0; j < 2; j++) {
        const int i = (tid >> 6) + 4 * j;
        const uint8_t *W, *S;
        const int tile = wtile(i, W, S);
        asrc[j] = W + (size_t)e * a.wstride + (size_t)tile * C * 1024 + q * 16;
        adst[j] = SB + i * 1024 + (q & 1) * 512 + (q >> 1) * 16;
    }
    const uint8_t *ssrc = nullptr;
    if (tid < 32) {
        const uint8_t *W, *S;
        const int tile = wtile(tid >> 2, W, S);
        ssrc = S + (size_t)e * a.sstride + (size_t)tile * C * 64 + (tid & 3) * 16;
    }
    auto rowof = [&](int j) { return MODE == FP4_GATEUP ? a.list[off + j] / a.topk : off + j; };
    constexpr int NB = BN / 32; /* BN rows x 8 pieces over 256 threads */
    const uint8_t *bsrc[NB];
    int bdst[NB];
    const int pc = tid & 7;
#pragma unroll
    for (int j = 0; j < NB; j++) {
        const int tk = (tid >> 3) + 32 * j;
        bsrc[j] = tk < cnt ? a.xq + (size_t)rowof(tk) * a.K + pc * 16 : nullptr;
        bdst[j] = tk * 128 + ((F16 ? pc : pc ^ (tk & 7)) << 4); /* F16: staged plain, converted below */
    }
    const float *xsrc = tid < BN && tid < cnt ? a.xs + (size_t)rowof(tid) * C : nullptr;

    auto load = [&](int st, int c) {
        uint8_t *base = sm + st * STAGE;
#pragma unroll
        for (int j = 0; j < 2; j++) cp_async16(base + adst[j], asrc[j] + (size_t)c * 1024, true);
        if (tid < 32) cp_async16(base + SB + SA + tid * 16, ssrc + (size_t)c * 64, true);
#pragma unroll
        for (int j = 0; j < NB; j++)
            cp_async16(base + bdst[j], bsrc[j] ? bsrc[j] + (size_t)c * 128 : a.xq, bsrc[j] != nullptr);
        if (tid < BN) cp_async4(base + SB + SA + SAS + tid * 4, xsrc ? xsrc + c : a.xs, xsrc != nullptr);
    };

    /* the quad exchange that turns the upload order into wgmma's A fragment */
    const uint32_t sel1 = t < 2 ? 0x5140u : 0x7362u, sel2 = t < 2 ? 0x7362u : 0x5140u;
    const int src1 = 4 * g + ((t & 1) ? 2 + (t >> 1) : (t >> 1));
    const int src2 = 4 * g + ((t & 1) ? (t >> 1) : 2 + (t >> 1));
    auto frag = [&](uint32_t w, uint32_t &k0, uint32_t &k16) {
        uint32_t lo, hi;
        fp4x8_to_e4m3(w, lo, hi); /* lo: columns 8t+0,2,4,6; hi: 8t+1,3,5,7 */
        const uint32_t r1 = __shfl_sync(0xffffffffu, __byte_perm(lo, hi, sel1), src1);
        const uint32_t r2 = __shfl_sync(0xffffffffu, __byte_perm(lo, hi, sel2), src2);
        k0 = (t & 1) ? r2 : r1;  /* columns 4t..4t+3 */
        k16 = (t & 1) ? r1 : r2; /* columns 16+4t..16+4t+3 */
    };

    float acc[NR], part[NR], d[NR], d2[PIPE ? NR : 1];
#pragma unroll
    for (int i = 0; i < NR; i++) acc[i] = 0.f;
#pragma unroll
    for (int st = 0; st < WG_STAGES - 1; st++) {
        if (st < C) load(st, st);
        cp_commit();
    }
    uint8_t *h16 = sm + WG_STAGES * STAGE; /* F16: the chunk's B as FP16, [2 k-halves][BN][128 bytes], swizzled */
    for (int c = 0; c < C; c++) {
        cp_wait<WG_STAGES - 2>();
        /* the cp.async writes are generic-proxy; wgmma reads through the async proxy */
        if (!F16) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        if (c + WG_STAGES - 1 < C) load((c + WG_STAGES - 1) % WG_STAGES, c + WG_STAGES - 1);
        cp_commit();
        const uint8_t *base = sm + (c % WG_STAGES) * STAGE;
        if (F16) {
            /* E4M3 -> FP16 into the k16 order of the A fragments below: k16 block j = 2s + h of step s
             * holds, for lane quad position t, columns (8t+4h, 8t+4h+2) at k 2t, 2t+1 and
             * (8t+4h+1, 8t+4h+3) at k 8+2t, 9+2t (e4m3x8_to_f16's order = fp4x8_to_f16's) */
#pragma unroll
            for (int k = 0; k < BN / 16; k++) {
                const int it = tid + 256 * k, n = it >> 4, s = (it >> 2) & 3, tt = it & 3;
                const uint2 xv = *(const uint2 *)(base + n * 128 + 32 * s + 8 * tt);
                uint32_t f[4];
                e4m3x8_to_f16(xv.x, xv.y, f);
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const int j = 2 * s + h;
                    uint8_t *row = h16 + (j >> 2) * BN * 128 + n * 128 + 4 * tt;
                    *(uint32_t *)(row + (((2 * (j & 3)) ^ (n & 7)) << 4)) = f[2 * h];
                    *(uint32_t *)(row + (((2 * (j & 3) + 1) ^ (n & 7)) << 4)) = f[2 * h + 1];
                }
            }
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            __syncthreads();
        }
        const uint8_t *pa = base + SB + (wg * 4 + w4) * 1024 + lane * 16;
        const uint4 wa0 = *(const uint4 *)pa, wa1 = *(const uint4 *)(pa + 512);
        const uint2 sc = *(const uint2 *)(base + SB + SA + (wg * 4 + w4) * 64 + g * 8);
        const uint64_t desc = wg_desc(F16 ? h16 : base);
        /* step s's MMA into dd (issued, not waited for) */
        auto issue = [&](int s, float (&dd)[NR]) {
            const uint4 &h = s < 2 ? wa0 : wa1;
            if constexpr (F16) {
                /* two k16 FP16 wgmmas (fp32 accumulation); A rows g / g+8 at k 2t.. and 8+2t.. */
                uint32_t fg[4], f8[4];
                fp4x8_to_f16((s & 1) ? h.z : h.x, fg);
                fp4x8_to_f16((s & 1) ? h.w : h.y, f8);
                const uint32_t af[8] = {fg[0], f8[0], fg[1], f8[1], fg[2], f8[2], fg[3], f8[3]};
                /* k16 block j = 2s + h at k-half j >> 2, 32 bytes per block: descriptor units of 16 bytes */
                const uint64_t d0 = desc + (((2 * s) >> 2) * BN * 128 + ((2 * s) & 3) * 32) / 16;
                const uint64_t d1 = desc + (((2 * s + 1) >> 2) * BN * 128 + ((2 * s + 1) & 3) * 32) / 16;
                if constexpr (BN == 64) wg_f16_n64(dd, af, d0, d1);
                else wg_f16_n128(dd, af, d0, d1);
            } else {
                uint32_t a0, a1, a2, a3;
                frag((s & 1) ? h.z : h.x, a0, a2); /* row g   */
                frag((s & 1) ? h.w : h.y, a1, a3); /* row g+8 */
                if constexpr (BN == 64) wg_fp8_n64(dd, a0, a1, a2, a3, desc + 2 * s); /* +32 bytes */
                else wg_fp8_n128(dd, a0, a1, a2, a3, desc + 2 * s);
            }
        };
        auto scale = [&](int s, float (&dd)[NR]) {
            /* 2^6 undoes the E2M1 -> E4M3 bit move */
            const float ws0 = e8m0_to_f32((sc.x >> (8 * s)) & 0xffu) * 64.f;
            const float ws1 = e8m0_to_f32((sc.y >> (8 * s)) & 0xffu) * 64.f;
#pragma unroll
            for (int i = 0; i < NR; i++) {
                const float ws = (i & 2) ? ws1 : ws0;
                part[i] = s ? part[i] + dd[i] * ws : dd[i] * ws;
            }
        };
        if constexpr (PIPE) {
            /* step s+1's MMA runs while step s is scaled (two accumulators) */
            issue(0, d);
#pragma unroll
            for (int s = 0; s < 4; s++) {
                float(&cur)[NR] = (s & 1) ? d2 : d;
                if (s < 3) {
                    issue(s + 1, (s & 1) ? d : d2);
                    wg_wait<1>();
                } else {
                    wg_wait<0>();
                }
                wg_reg_fence(cur);
                scale(s, cur);
            }
        } else {
#pragma unroll
            for (int s = 0; s < 4; s++) {
                issue(s, d);
                wg_wait<0>();
                wg_reg_fence(d);
                scale(s, d);
            }
        }
        const float *sx = (const float *)(base + SB + SA + SAS);
#pragma unroll
        for (int j = 0; j < BN / 8; j++) {
            const float2 xv = *(const float2 *)(sx + 8 * j + 2 * t);
            acc[4 * j + 0] += part[4 * j + 0] * xv.x;
            acc[4 * j + 1] += part[4 * j + 1] * xv.y;
            acc[4 * j + 2] += part[4 * j + 2] * xv.x;
            acc[4 * j + 3] += part[4 * j + 3] * xv.y;
        }
    }
    cp_wait<0>();
    __syncthreads(); /* every stage read: the epilogue reuses shared memory */
    /* accumulator i of thread (warp w4, lane 4g+t): row 16w4 + g + 8((i>>1)&1), column 8(i>>2) + 2t + (i&1) */
    float *ex = (float *)sm;
    const int lt = tid & 127;
    if (MODE == FP4_GATEUP) {
        if (wg == 1) {
#pragma unroll
            for (int i = 0; i < NR; i++) ex[i * 128 + lt] = acc[i];
        }
        __syncthreads();
        if (wg == 0) {
#pragma unroll
            for (int i = 0; i < NR; i++) {
                const int j = 8 * (i >> 2) + 2 * t + (i & 1);
                if (j >= cnt) continue;
                const int r = blockIdx.x * 64 + 16 * w4 + g + 8 * ((i >> 1) & 1);
                a.y[(size_t)(off + j) * a.R + r] = moe_h(acc[i], ex[i * 128 + lt], a.wts[a.list[off + j]], a.flags);
            }
        }
    } else {
#pragma unroll
        for (int i = 0; i < NR; i++) {
            const int j = 8 * (i >> 2) + 2 * t + (i & 1);
            if (j >= cnt) continue;
            const int r = blockIdx.x * 128 + 64 * wg + 16 * w4 + g + 8 * ((i >> 1) & 1);
            float out = acc[i];
            if (a.flags & DSV4_CUDA_MOE_BF16) out = round_bf16(out);
            a.y[(size_t)(off + j) * a.R + r] = out;
        }
    }
#else
    (void)a;
    (void)tiles; /* never launched: moe_wg_variant() returns 0 without sm_90a code */
#endif
}

template <int MODE, int BN, bool F16, bool PIPE>
static int launch_moe_wg(dsv4_cuda_ctx *c, const Fp4Args &a, const int *tiles, int max_tiles, dsv4_err *err) {
    const size_t smem = wg_smem<BN, F16>();
    CU_TRY(cudaFuncSetAttribute(k_moe_wg<MODE, BN, F16, PIPE>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem), err,
           "fp4 experts wgmma (shared memory)");
    dim3 grid((unsigned)(a.R / (MODE == FP4_GATEUP ? 64 : 128)), (unsigned)max_tiles);
    CU_TRY(cu_launch(c, k_moe_wg<MODE, BN, F16, PIPE>, grid, dim3(256), smem, a, tiles), err,
           MODE == FP4_GATEUP ? "fp4 experts wgmma w1/w3" : "fp4 experts wgmma w2");
    return DSV4_OK;
}

#define MOE_WG_VARIANTS 6
static const MoeGemmLaunch moe_wg_launch[MOE_WG_VARIANTS][2] = {
    {launch_moe_wg<FP4_GATEUP, 64, false, false>, launch_moe_wg<FP4_DOWN, 64, false, false>},
    {launch_moe_wg<FP4_GATEUP, 128, false, false>, launch_moe_wg<FP4_DOWN, 128, false, false>},
    {launch_moe_wg<FP4_GATEUP, 64, true, false>, launch_moe_wg<FP4_DOWN, 64, true, false>},
    {launch_moe_wg<FP4_GATEUP, 128, true, false>, launch_moe_wg<FP4_DOWN, 128, true, false>},
    {launch_moe_wg<FP4_GATEUP, 64, false, true>, launch_moe_wg<FP4_DOWN, 64, false, true>},
    {launch_moe_wg<FP4_GATEUP, 64, true, true>, launch_moe_wg<FP4_DOWN, 64, true, true>},
};
static const int moe_wg_bn[MOE_WG_VARIANTS] = {64, 128, 64, 128, 64, 64};

/*
 * Which k_moe_wg runs, 0 where none: DSV4_CUDA_MOE_WG (read per call;
 * default 0 = k_moe_gemm) 1 / 2 = FP8 wgmma, 64 / 128 token rows per tile;
 * 3 / 4 = FP16 wgmma, 64 / 128 rows; 5 / 6 = FP8 / FP16, 64 rows, two
 * accumulators (the next step's MMA in flight while one is scaled). From DSV4_CUDA_MOE_WG_MIN (default 48)
 * average rows per expert, on the grouped-GEMM path only, on a 9.0 device
 * with sm_90a code in the build.
 */
static int moe_wg_variant(const dsv4_cuda_ctx *c, int gemm, int nent, int E) {
    if (!MOE_WG_HOST || !gemm || c->prop.major != 9 || c->prop.minor != 0) return 0;
    const int v = cu_env_int("DSV4_CUDA_MOE_WG", 0);
    if (v <= 0 || v > MOE_WG_VARIANTS || nent < (long long)cu_env_int("DSV4_CUDA_MOE_WG_MIN", 48) * E) return 0;
    return v;
}

#endif /* DSV4_CUDA_MOE_WG_CUH */
