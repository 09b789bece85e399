// The gc128 content digest's GPU kernel: the lane sums of many tensor views in one launch.
// The algorithm is defined (and its CPU twin written) in graphcheck's src/document/digest.rs;
// its constants arrive as -D definitions from there, so the two cannot drift apart. The host
// finalizes the lane sums with the twin's code.
//
// Work: every view's words are cut into chunks of CHUNK_WORDS; each block takes a contiguous
// range of the chunks of all views (a prefix sum over views says where each view's chunks
// start), so 100,000 small views cost about what one large one of the same bytes does. Each
// warp sums its terms and adds them atomically to its view's two accumulators when the
// block moves to the next view: sums mod 2^64 do not depend on the order of the adds.
// Contiguous and strided views go to two kernels (gc128_lanes, gc128_lanes_strided) built
// from the same code: the gather's index arithmetic took the contiguous kernel from 60 to 80
// registers (ptxas -v, sm_90), i.e. from 4 to 3 blocks of 256 threads per SM.
//
// Reads: a contiguous view aligned to 16 bytes reads whole 16-byte pairs of words, all loads
// of a thread issued before any arithmetic; anything else reads one aligned 8-byte word (two
// where the view is misaligned) per word, and never an aligned word that holds no byte of the
// view, so nothing outside the view's pages is touched. A strided view gathers each word's
// elements through its sizes and strides: no copy of any view is made.

#if !defined(GC_KEY_A) || !defined(GC_KEY_B) || !defined(GC_FMIX_1) || !defined(GC_FMIX_2)
#error "compile with the digest's constants (-DGC_KEY_A=... and the others)"
#endif

typedef unsigned long long u64;
typedef unsigned int u32;

// Tuning, from the host (-DGC_UNROLL, -DGC_MIN_BLOCKS; GRAPHCHECK_DIGEST_TUNING): 16-byte
// loads in flight per thread, and the blocks per SM the contiguous kernel's registers must
// allow (0: no such bound).
#ifndef GC_UNROLL
#define GC_UNROLL 4
#endif
#ifndef GC_MIN_BLOCKS
#define GC_MIN_BLOCKS 0
#endif

#define BLOCK 256
#define UNROLL GC_UNROLL
#define CHUNK_WORDS (2 * BLOCK * UNROLL)
#define MAX_DIMS 12
#define CONTIGUOUS 0xffffffffu

// One view (32 bytes; the host writes the same layout).
struct Seg {
    u64 addr;         // its first element
    u64 nbytes;       // bytes of its row-major element stream (> 0)
    u64 first_chunk;  // its first chunk among all views' (increasing)
    u32 out;          // its accumulator pair
    u32 layout;       // CONTIGUOUS, or its strided layout's index
};

// A strided view's dimensions after merging, outermost first (8 + 16 * MAX_DIMS bytes).
struct Layout {
    u32 ndim;
    u32 itemsize;
    u64 size[MAX_DIMS];
    u64 stride[MAX_DIMS];  // in bytes
};

// The 32x32->64-bit multiply-add of lane A, written out: as a 64-bit C multiply of widened
// operands NVRTC emits mul.lo.s64, which ptxas need not shrink back to one IMAD.WIDE.U32.
__device__ __forceinline__ u64 mad_wide(u32 x, u32 y, u64 c) {
    u64 r;
    asm("mad.wide.u32 %0, %1, %2, %3;" : "=l"(r) : "r"(x), "r"(y), "l"(c));
    return r;
}

// MurmurHash3's 64-bit finalizer.
__device__ __forceinline__ u64 fmix64(u64 x) {
    x ^= x >> 33;
    x *= GC_FMIX_1;
    x ^= x >> 33;
    x *= GC_FMIX_2;
    return x ^ (x >> 33);
}

// Adds word w, whose keys are k = (i + 1) * KEY_A and q = (i + 1) * KEY_B, to the lanes.
__device__ __forceinline__ void add_word(u64 w, u64 k, u64 q, u64 &a, u64 &b) {
    u32 x = (u32)w + (u32)k;
    u32 y = (u32)(w >> 32) + (u32)(k >> 32);
    a = mad_wide(x, y, a);
    b += fmix64(w ^ q);
}

// Word i of a contiguous view (bytes [8i, 8i + 8) of it), zero-padded past its end.
__device__ __forceinline__ u64 load_word(u64 addr, u64 nbytes, u64 i) {
    u64 start = addr + 8 * i;
    u64 avail = nbytes - 8 * i;
    u32 mis = (u32)(start & 7);
    const u64 *p = (const u64 *)(start - mis);
    u64 w = __ldg(p);
    if (mis) {
        w >>= 8 * mis;
        // The next aligned word only where it holds bytes of the view.
        if (avail > 8 - mis) w |= __ldg(p + 1) << (64 - 8 * mis);
    }
    if (avail < 8) w &= (1ull << (8 * avail)) - 1;
    return w;
}

// n (1 to 8) bytes at `at`, little-endian.
__device__ __forceinline__ u64 load_bytes(u64 at, u32 n) {
    if (n == 8 && (at & 7) == 0) return __ldg((const u64 *)at);
    if (n == 4 && (at & 3) == 0) return __ldg((const u32 *)at);
    if (n == 2 && (at & 1) == 0) return __ldg((const unsigned short *)at);
    u64 v = 0;
    for (u32 k = 0; k < n; ++k) v |= (u64)__ldg((const unsigned char *)(at + k)) << (8 * k);
    return v;
}

// Word i of a strided view, gathered element by element (or 8-byte half of one).
__device__ u64 gather_word(u64 addr, u64 nbytes, const Layout *L, u64 i) {
    u32 isz = L->itemsize, ndim = L->ndim;
    u64 pos = 8 * i;
    u64 end = pos + 8 < nbytes ? pos + 8 : nbytes;
    u64 w = 0;
    u32 shift = 0;
    while (pos < end) {
        u64 e = pos / isz;
        u32 off = (u32)(pos - e * isz);
        u32 take = isz - off;
        if (take > end - pos) take = (u32)(end - pos);
        u64 at = addr + off;
        u64 rest = e;
        for (int d = (int)ndim - 1; d >= 0; --d) {
            u64 n = L->size[d];
            u64 q = rest / n;
            at += (rest - q * n) * L->stride[d];
            rest = q;
        }
        w |= load_bytes(at, take) << shift;
        shift += 8 * take;
        pos += take;
    }
    return w;
}

// Adds the terms of chunk `chunk` of view s to this thread's lanes.
template <bool STRIDED>
__device__ __forceinline__ void chunk_lanes(const Seg &s, const Layout *__restrict__ layouts,
                                            u64 chunk, u64 &a, u64 &b) {
    u64 nwords = (s.nbytes + 7) >> 3;
    u64 w0 = chunk * CHUNK_WORDS;
    u64 wend = w0 + CHUNK_WORDS < nwords ? w0 + CHUNK_WORDS : nwords;
    u32 t = threadIdx.x;
    if (STRIDED) {
        const Layout *L = layouts + s.layout;
        for (u64 i = w0 + t; i < wend; i += BLOCK)
            add_word(gather_word(s.addr, s.nbytes, L, i), (i + 1) * GC_KEY_A, (i + 1) * GC_KEY_B,
                     a, b);
        return;
    }
    u64 rest = w0;  // where the per-word loop below starts
    if ((s.addr & 15) == 0) {
        // Whole pairs of full words: [w0, fend) rounded down to pairs.
        u64 full = s.nbytes >> 3;
        u64 fend = wend < full ? wend : full;
        u64 pairs_end = w0 + ((fend - w0) & ~1ull);
        const ulonglong2 *p = (const ulonglong2 *)s.addr;
        ulonglong2 v[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            u64 i = w0 + 2 * (t + u * BLOCK);
            if (i < pairs_end) v[u] = __ldg(p + (i >> 1));
        }
        u64 j = w0 + 2 * t + 1;
        u64 k = j * GC_KEY_A, q = j * GC_KEY_B;
#pragma unroll
        for (int u = 0; u < UNROLL; ++u) {
            u64 i = w0 + 2 * (t + u * BLOCK);
            if (i < pairs_end) {
                add_word(v[u].x, k, q, a, b);
                add_word(v[u].y, k + GC_KEY_A, q + GC_KEY_B, a, b);
            }
            k += 2 * BLOCK * GC_KEY_A;
            q += 2 * BLOCK * GC_KEY_B;
        }
        rest = pairs_end;
    }
    for (u64 i = rest + t; i < wend; i += BLOCK)
        add_word(load_word(s.addr, s.nbytes, i), (i + 1) * GC_KEY_A, (i + 1) * GC_KEY_B, a, b);
}

// Adds the warp's lanes to view `out`'s accumulators.
__device__ __forceinline__ void flush(u64 *__restrict__ acc, u32 out, u64 a, u64 b) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        a += __shfl_down_sync(0xffffffffu, a, o);
        b += __shfl_down_sync(0xffffffffu, b, o);
    }
    if ((threadIdx.x & 31) == 0 && (a | b) != 0) {
        atomicAdd(acc + 2 * (u64)out, a);
        atomicAdd(acc + 2 * (u64)out + 1, b);
    }
}

// Block x takes chunks [x * per_block, (x + 1) * per_block) of all views' `total` chunks.
template <bool STRIDED>
__device__ __forceinline__ void lanes(const Seg *__restrict__ segs, u32 nsegs,
                                      const Layout *__restrict__ layouts, u64 *__restrict__ acc,
                                      u64 total, u64 per_block) {
    u64 c = (u64)blockIdx.x * per_block;
    u64 cend = c + per_block < total ? c + per_block : total;
    if (c >= cend) return;
    // The view holding chunk c: the last whose first chunk is at most c.
    u32 lo = 0, hi = nsegs;
    while (hi - lo > 1) {
        u32 mid = (lo + hi) >> 1;
        if (segs[mid].first_chunk <= c) lo = mid;
        else hi = mid;
    }
    u32 s = lo;
    Seg seg = segs[s];
    u64 next = s + 1 < nsegs ? segs[s + 1].first_chunk : total;
    u64 a = 0, b = 0;
    for (; c < cend; ++c) {
        while (c >= next) {
            flush(acc, seg.out, a, b);
            a = b = 0;
            ++s;
            seg = segs[s];
            next = s + 1 < nsegs ? segs[s + 1].first_chunk : total;
        }
        chunk_lanes<STRIDED>(seg, layouts, c - seg.first_chunk, a, b);
    }
    flush(acc, seg.out, a, b);
}

// Contiguous views (every `layout` is CONTIGUOUS). A minimum of blocks per SM is asked for
// only when tuned: `__launch_bounds__(256, 1)` took ptxas from 60 to 76 registers.
#if GC_MIN_BLOCKS > 0
extern "C" __global__ void __launch_bounds__(BLOCK, GC_MIN_BLOCKS)
#else
extern "C" __global__ void __launch_bounds__(BLOCK)
#endif
gc128_lanes(const Seg *__restrict__ segs, u32 nsegs, const Layout *__restrict__ layouts,
            u64 *__restrict__ acc, u64 total, u64 per_block) {
    lanes<false>(segs, nsegs, layouts, acc, total, per_block);
}

// Strided views (every `layout` indexes `layouts`).
extern "C" __global__ void __launch_bounds__(BLOCK)
gc128_lanes_strided(const Seg *__restrict__ segs, u32 nsegs, const Layout *__restrict__ layouts,
                    u64 *__restrict__ acc, u64 total, u64 per_block) {
    lanes<true>(segs, nsegs, layouts, acc, total, per_block);
}
