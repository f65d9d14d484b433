/* The served keyed noise in one pass per block: SplitMix64 words -> the table's piecewise polynomial ->
 * scale -> float64 sum of the levels -> plus the logit, rounded once to the logits' dtype.
 *
 * The same steps as caliber_core/serving/keyed_noise.py, so the same bits: every float step is one
 * correctly rounded IEEE operation, built with -ffp-contract=off (no multiply and add fused into one
 * rounding) and never with -ffast-math. Built and loaded by fused_noise.py; plain C, no Python or
 * torch headers, so it compiles in about a second.
 */
#include <pthread.h>
#include <stdint.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define GAMMA 0x9E3779B97F4A7C15ULL
#define M1 0xBF58476D1CE4E5B9ULL
#define M2 0x94D049BB133111EBULL
#define MASK52 ((1ULL << 52) - 1)
#define SUB_BITS 6
#define T_BITS (52 - SUB_BITS)
#define MASK_T ((1ULL << T_BITS) - 1)
#define FIRST_PIECE (1022ULL << SUB_BITS) /* a / 2 >= 1/2: biased exponent 1022 */
#define N_PIECES (53 << SUB_BITS)
#define DEGREE 4
#define SIGN (1ULL << 63)
#define BLOCK 256 /* columns per block: the sum and one draw stay in L1 */
#define MAX_LEVELS 64
#define KERNEL_ABI 2

enum { DT_FLOAT64 = 0, DT_FLOAT32 = 1, DT_FLOAT16 = 2, DT_BFLOAT16 = 3 };

static double coefficients[DEGREE + 1][N_PIECES]; /* one row per power, lowest first */
/* A piece's coefficients in one 64-byte line (c0..c3, c4, padding): four draws' pieces are four aligned
 * loads and a transpose. Collecting each power on its own (five gathers, or the twenty scalar loads and
 * inserts the compiler made of the plain loop) took 1.5 to 2 times as long a draw on AVX2. */
#define LINE_SHIFT 6 /* 64 bytes a piece */
static double piece_lines[N_PIECES][1 << (LINE_SHIFT - 3)] __attribute__((aligned(64)));
uint64_t caliber_sink;                           /* what the discarded draws fold into: never elided */

static inline double as_double(uint64_t u) { double d; memcpy(&d, &u, 8); return d; }
static inline uint64_t as_u64(double d) { uint64_t u; memcpy(&u, &d, 8); return u; }
static inline float as_float(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static inline uint32_t as_u32(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

int caliber_kernel_abi(void) { return KERNEL_ABI; }

int caliber_set_table(const double *table, int64_t n_columns) {
    /* table: (DEGREE + 1, n_columns) row-major, the first N_PIECES columns the positive half. */
    if (n_columns < N_PIECES) return -1;
    for (int p = 0; p <= DEGREE; p++) memcpy(coefficients[p], table + p * n_columns, sizeof(coefficients[p]));
    for (int i = 0; i < N_PIECES; i++)
        for (int p = 0; p < 1 << (LINE_SHIFT - 3); p++) piece_lines[i][p] = p <= DEGREE ? coefficients[p][i] : 0.0;
    return 0;
}

/* Step 4 of the derivation: the word's sign bit, and |x| from its low 52 bits. Horner with the
 * positive half's coefficients, then the sign set: negating every coefficient negates each rounded
 * step exactly, so this is numpy's gather from the negated half. */
static inline double normal_of(uint64_t w) {
    double half_a = as_double((w & MASK52) | 0x4330000000000000ULL) - 4503599627370495.5; /* 2^52 - 1/2 */
    uint64_t bits = as_u64(half_a);
    uint64_t piece = (bits >> T_BITS) - FIRST_PIECE;
    double t = as_double((bits & MASK_T) | 0x4050000000000000ULL) - 64.0; /* exact */
    double y = coefficients[4][piece];
    y = y * t + coefficients[3][piece];
    y = y * t + coefficients[2][piece];
    y = y * t + coefficients[1][piece];
    y = y * t + coefficients[0][piece];
    return as_double(as_u64(y) ^ (w & SIGN));
}

static inline uint64_t mix(uint64_t z) {
    z = (z ^ (z >> 30)) * M1;
    z = (z ^ (z >> 27)) * M2;
    return z ^ (z >> 31);
}

#ifdef __AVX2__
/* SplitMix64's 64-bit multiply by a constant in 32-bit pieces (AVX2 has no 64-bit vector multiply):
 * the low 64 bits of a * c = lo(a) lo(c) + ((hi(a) lo(c) + lo(a) hi(c)) << 32), wrapping as uint64 does. */
static inline __m256i mul64_by(__m256i a, uint64_t c) {
    __m256i c_lo = _mm256_set1_epi64x((int64_t)(c & 0xffffffffULL)), c_hi = _mm256_set1_epi64x((int64_t)(c >> 32));
    __m256i cross = _mm256_add_epi64(_mm256_mul_epu32(_mm256_srli_epi64(a, 32), c_lo), _mm256_mul_epu32(a, c_hi));
    return _mm256_add_epi64(_mm256_mul_epu32(a, c_lo), _mm256_slli_epi64(cross, 32));
}

static inline __m256i mix4(__m256i z) {
    z = mul64_by(_mm256_xor_si256(z, _mm256_srli_epi64(z, 30)), M1);
    z = mul64_by(_mm256_xor_si256(z, _mm256_srli_epi64(z, 27)), M2);
    return _mm256_xor_si256(z, _mm256_srli_epi64(z, 31));
}
#endif

/* target[i] (+)= inc * normal_of(mix(seed + first + i * GAMMA)) for i < n; the scalar loop's bits.
 * With AVX2, two passes over the block (held in L1): the words, each draw's piece (as a byte offset
 * into piece_lines), t and sign, four lanes at a time; then four pieces' lines transposed into one
 * vector per power and their c4, Horner with one rounding per multiply and per add, the sign, the scale. */
static void draw_block(uint64_t seed, uint64_t first, double *target, double inc, int n, int accumulate) {
    int i = 0;
#ifdef __AVX2__
    int64_t offset[BLOCK] __attribute__((aligned(32)));
    double local[BLOCK] __attribute__((aligned(32)));
    uint64_t sign[BLOCK] __attribute__((aligned(32)));
    int vector_n = n & ~3;
    /* seed + (column) * GAMMA for four columns, stepped by 4 * GAMMA: the counters never touch memory. */
    __m256i z = _mm256_add_epi64(_mm256_set1_epi64x((int64_t)(seed + first)),
                                 _mm256_set_epi64x((int64_t)(3 * GAMMA), (int64_t)(2 * GAMMA), (int64_t)GAMMA, 0));
    const __m256i step = _mm256_set1_epi64x((int64_t)(4 * GAMMA));
    for (int j = 0; j < vector_n; j += 4, z = _mm256_add_epi64(z, step)) {
        __m256i w = mix4(z);
        __m256i biased = _mm256_or_si256(_mm256_and_si256(w, _mm256_set1_epi64x(MASK52)),
                                         _mm256_set1_epi64x(0x4330000000000000LL));
        __m256i bits = _mm256_castpd_si256(_mm256_sub_pd(_mm256_castsi256_pd(biased),
                                                         _mm256_set1_pd(4503599627370495.5)));
        __m256i t_bits = _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi64x(MASK_T)),
                                         _mm256_set1_epi64x(0x4050000000000000LL));
        /* The piece (the exponent and the next SUB_BITS bits: bits >> T_BITS) times 64 bytes, counted
         * from FIRST_PIECE's line: the start of `lines` below is that much before piece_lines. */
        _mm256_store_si256((__m256i *)(offset + j),
                           _mm256_and_si256(_mm256_srli_epi64(bits, T_BITS - LINE_SHIFT),
                                            _mm256_set1_epi64x(-(1LL << LINE_SHIFT))));
        _mm256_store_pd(local + j, _mm256_sub_pd(_mm256_castsi256_pd(t_bits), _mm256_set1_pd(64.0)));
        _mm256_store_si256((__m256i *)(sign + j), _mm256_and_si256(w, _mm256_set1_epi64x((int64_t)SIGN)));
    }
    const char *lines = (const char *)((uintptr_t)piece_lines - FIRST_PIECE * sizeof(piece_lines[0]));
    const __m256d scale = _mm256_set1_pd(inc);
    for (; i < vector_n; i += 4) {
        const double *p0 = (const double *)(lines + offset[i]), *p1 = (const double *)(lines + offset[i + 1]);
        const double *p2 = (const double *)(lines + offset[i + 2]), *p3 = (const double *)(lines + offset[i + 3]);
        __m256d r0 = _mm256_load_pd(p0), r1 = _mm256_load_pd(p1), r2 = _mm256_load_pd(p2), r3 = _mm256_load_pd(p3);
        __m256d even01 = _mm256_unpacklo_pd(r0, r1), odd01 = _mm256_unpackhi_pd(r0, r1);
        __m256d even23 = _mm256_unpacklo_pd(r2, r3), odd23 = _mm256_unpackhi_pd(r2, r3);
        __m256d c4 = _mm256_insertf128_pd(_mm256_castpd128_pd256(_mm_loadh_pd(_mm_load_sd(p0 + 4), p1 + 4)),
                                          _mm_loadh_pd(_mm_load_sd(p2 + 4), p3 + 4), 1);
        __m256d t = _mm256_load_pd(local + i);
        __m256d y = _mm256_add_pd(_mm256_mul_pd(c4, t), _mm256_permute2f128_pd(odd01, odd23, 0x31));   /* c3 */
        y = _mm256_add_pd(_mm256_mul_pd(y, t), _mm256_permute2f128_pd(even01, even23, 0x31));          /* c2 */
        y = _mm256_add_pd(_mm256_mul_pd(y, t), _mm256_permute2f128_pd(odd01, odd23, 0x20));            /* c1 */
        y = _mm256_add_pd(_mm256_mul_pd(y, t), _mm256_permute2f128_pd(even01, even23, 0x20));          /* c0 */
        y = _mm256_xor_pd(y, _mm256_load_pd((const double *)(sign + i)));
        __m256d x = _mm256_mul_pd(y, scale);
        if (accumulate) x = _mm256_add_pd(_mm256_loadu_pd(target + i), x);
        _mm256_storeu_pd(target + i, x);
    }
#endif
    if (accumulate) {
        for (; i < n; i++) target[i] = target[i] + normal_of(mix(seed + first + (uint64_t)i * GAMMA)) * inc;
    } else {
        for (; i < n; i++) target[i] = normal_of(mix(seed + first + (uint64_t)i * GAMMA)) * inc;
    }
}

void caliber_normals_from_words(const uint64_t *words, double *out, int64_t n) {
    for (int64_t i = 0; i < n; i++) out[i] = normal_of(words[i]);
}

/* Exact conversions to float64. */
static inline float half_to_float(uint16_t h) { /* selects, not branches: the loop vectorizes */
    uint32_t o = (uint32_t)(h & 0x7fff) << 13, exp = o & (0x7c00u << 13);
    o += (127 - 15) << 23;
    uint32_t inf = o + ((128 - 16) << 23);
    uint32_t subnormal = as_u32(as_float(o + (1u << 23)) - as_float(113u << 23)); /* exact */
    o = exp == 0x7c00u << 13 ? inf : exp == 0 ? subnormal : o;
    return as_float(o | ((uint32_t)(h & 0x8000) << 16));
}

/* float64 -> float32 rounded to odd: with 24 bits, at least two more than float16's and bfloat16's
 * significands, a round to nearest even from it is the one correct rounding of the float64. */
static inline uint32_t to_odd_float(double d) {
    float f = (float)d;
    double back = f;
    uint32_t bits = as_u32(f);
    bits -= ((back > d) == (d > 0.0)) & (back != d); /* the rounding went away from zero: step back */
    return bits | (back != d);
}

static inline uint16_t float_to_half(uint32_t x) { /* round to nearest even; no NaN reaches here */
    uint32_t sign = x & 0x80000000u;
    x ^= sign;
    uint32_t subnormal = as_u32(as_float(x) + as_float(126u << 23)) - (126u << 23); /* the add rounds */
    uint32_t normal = (x + ((uint32_t)(15 - 127) << 23) + 0xfff + ((x >> 13) & 1)) >> 13;
    uint32_t o = x >= (127u + 16) << 23 ? 0x7c00 : x < 113u << 23 ? subnormal : normal; /* >= 65536: inf */
    return (uint16_t)(o | (sign >> 16));
}

/* out[i] = sum[i] + in[i], rounded once to the dtype: one loop per dtype, so each vectorizes. */
static void finish(const char *in, char *out, const double *sum, int n, int dtype) {
    switch (dtype) {
    case DT_FLOAT64:
        for (int i = 0; i < n; i++) ((double *)out)[i] = sum[i] + ((const double *)in)[i];
        break;
    case DT_FLOAT32:
        for (int i = 0; i < n; i++) ((float *)out)[i] = (float)(sum[i] + ((const float *)in)[i]);
        break;
    case DT_FLOAT16:
        for (int i = 0; i < n; i++)
            ((uint16_t *)out)[i] = float_to_half(to_odd_float(sum[i] + half_to_float(((const uint16_t *)in)[i])));
        break;
    default:
        for (int i = 0; i < n; i++) {
            uint32_t b = to_odd_float(sum[i] + as_float((uint32_t)((const uint16_t *)in)[i] << 16));
            ((uint16_t *)out)[i] = (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
        }
    }
}

/* float64 -> the dtype, rounded once (the conversions finish() makes, for tests). */
void caliber_round_to(const double *in, void *out, int64_t n, int dtype) {
    for (int64_t i = 0; i < n; i++) {
        double d = in[i];
        if (dtype == DT_FLOAT64) ((double *)out)[i] = d;
        else if (dtype == DT_FLOAT32) ((float *)out)[i] = (float)d;
        else if (dtype == DT_FLOAT16) ((uint16_t *)out)[i] = float_to_half(to_odd_float(d));
        else {
            uint32_t b = to_odd_float(d);
            ((uint16_t *)out)[i] = (uint16_t)((b + 0x7fff + ((b >> 16) & 1)) >> 16);
        }
    }
}

/* The logits' dtype -> float64, exactly (for tests). */
void caliber_widen(const void *in, double *out, int64_t n, int dtype) {
    for (int64_t i = 0; i < n; i++) {
        if (dtype == DT_FLOAT64) out[i] = ((const double *)in)[i];
        else if (dtype == DT_FLOAT32) out[i] = ((const float *)in)[i];
        else if (dtype == DT_FLOAT16) out[i] = half_to_float(((const uint16_t *)in)[i]);
        else out[i] = as_float((uint32_t)((const uint16_t *)in)[i] << 16);
    }
}

/* The smallest and largest value of (n_rows, n_classes) rows, and whether any is NaN: the request check in one
 * pass (torch.aminmax took 3 ms a batch of 8 x 32,000 inside vLLM's CPU engine, the kernel 5). min(v, m) keeps m
 * when v is NaN, as the vector min does, so NaN is counted on its own; a min of +0 and -0 may be either. */
static inline float widen_16(uint16_t b, int dtype) {
    return dtype == DT_FLOAT16 ? half_to_float(b) : as_float((uint32_t)b << 16);
}

static void min_max_row(const char *row, int64_t n, int dtype, double *lo, double *hi, int *nan) {
    int64_t i = 0;
    if (dtype == DT_FLOAT64) {
        double l = *lo, h = *hi;
#ifdef __AVX2__
        __m256d vl = _mm256_set1_pd(l), vh = _mm256_set1_pd(h), vn = _mm256_setzero_pd();
        for (; i + 4 <= n; i += 4) {
            __m256d v = _mm256_loadu_pd((const double *)row + i);
            vl = _mm256_min_pd(v, vl), vh = _mm256_max_pd(v, vh);
            vn = _mm256_or_pd(vn, _mm256_cmp_pd(v, v, _CMP_UNORD_Q));
        }
        double bl[4], bh[4], bn[4];
        _mm256_storeu_pd(bl, vl), _mm256_storeu_pd(bh, vh), _mm256_storeu_pd(bn, vn);
        for (int k = 0; k < 4; k++) l = bl[k] < l ? bl[k] : l, h = bh[k] > h ? bh[k] : h, *nan |= as_u64(bn[k]) != 0;
#endif
        for (; i < n; i++) {
            double v = ((const double *)row)[i];
            l = v < l ? v : l, h = v > h ? v : h, *nan |= v != v;
        }
        *lo = l, *hi = h;
        return;
    }
    float l = (float)*lo, h = (float)*hi; /* the other dtypes widen to float exactly */
#ifdef __AVX2__
    __m256 vl = _mm256_set1_ps(l), vh = _mm256_set1_ps(h), vn = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
        __m256 v;
        if (dtype == DT_FLOAT32) {
            v = _mm256_loadu_ps((const float *)row + i);
        } else {
            float w[8];
            for (int k = 0; k < 8; k++) w[k] = widen_16(((const uint16_t *)row)[i + k], dtype);
            v = _mm256_loadu_ps(w);
        }
        vl = _mm256_min_ps(v, vl), vh = _mm256_max_ps(v, vh);
        vn = _mm256_or_ps(vn, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    }
    float bl[8], bh[8], bn[8];
    _mm256_storeu_ps(bl, vl), _mm256_storeu_ps(bh, vh), _mm256_storeu_ps(bn, vn);
    for (int k = 0; k < 8; k++) l = bl[k] < l ? bl[k] : l, h = bh[k] > h ? bh[k] : h, *nan |= as_u32(bn[k]) != 0;
#endif
    for (; i < n; i++) {
        float v = dtype == DT_FLOAT32 ? ((const float *)row)[i] : widen_16(((const uint16_t *)row)[i], dtype);
        l = v < l ? v : l, h = v > h ? v : h, *nan |= v != v;
    }
    *lo = l, *hi = h;
}

void caliber_min_max(const void *x, int64_t n_rows, int64_t n_classes, int64_t stride, int dtype, double *out) {
    double lo = 1.0 / 0.0, hi = -1.0 / 0.0;
    int nan = 0;
    for (int64_t r = 0; r < n_rows; r++) min_max_row((const char *)x + r * stride, n_classes, dtype, &lo, &hi, &nan);
    out[0] = lo, out[1] = hi, out[2] = nan;
}

typedef struct {
    const char *logits;
    char *out;
    int64_t logit_stride, out_stride; /* bytes between rows */
    int64_t n_rows, n_classes;
    int dtype, item, n_levels;
    const uint64_t *seeds;     /* (n_levels, n_rows) */
    const double *increments;  /* (n_levels,) */
    const int32_t *served;     /* (n_rows,): how many levels each row adds; NULL: all */
    int64_t start, stop;       /* this worker's elements of the flat (n_rows, n_classes) range */
    uint64_t sink;
} Job;

/* One row's columns [c0, c1): every level is drawn; the first `served` are summed in level order,
 * ((inc_1 xi_1 + inc_2 xi_2) + ...) + logit, rounded once; the rest fold into the sink. */
static void row_block(Job *job, int64_t r, int64_t c0, int64_t c1) {
    double sum[BLOCK], draw[BLOCK];
    const char *in = job->logits + r * job->logit_stride;
    char *out = job->out + r * job->out_stride;
    int served = job->served ? job->served[r] : job->n_levels;
    uint64_t sink = 0;
    for (int64_t b0 = c0; b0 < c1; b0 += BLOCK) {
        int n = (int)(c1 - b0 < BLOCK ? c1 - b0 : BLOCK);
        uint64_t first = (uint64_t)b0 * GAMMA;
        for (int level = 0; level < job->n_levels; level++) {
            uint64_t seed = job->seeds[(int64_t)level * job->n_rows + r];
            double inc = job->increments[level];
            double *target = level < served ? sum : draw;
            draw_block(seed, first, target, inc, n, !(level == 0 || level == served));
        }
        if (served > 0) {
            finish(in + b0 * job->item, out + b0 * job->item, sum, n, job->dtype);
        } else {
            if (out != in) memcpy(out + b0 * job->item, in + b0 * job->item, (size_t)n * job->item); /* in place */
        }
        /* Every row folds one buffer into the sink, the discarded draws or its own sum: the same work at
         * every level (the top level included), and the discarded draws can never be optimized away. */
        const double *fold = served < job->n_levels ? draw : sum;
        if (job->n_levels > 0)
            for (int i = 0; i < n; i++) sink ^= as_u64(fold[i]);
    }
    job->sink ^= sink;
}

static void *run_job(void *arg) {
    Job *job = (Job *)arg;
    int64_t k = job->n_classes;
    for (int64_t e = job->start; e < job->stop;) {
        int64_t r = e / k, c0 = e % k, c1 = k;
        if (r * k + c1 > job->stop) c1 = job->stop - r * k;
        row_block(job, r, c0, c1);
        e = r * k + c1;
    }
    return NULL;
}

/* Returns 0, or -1 for arguments this kernel does not take (the caller checked them already). */
int caliber_add_keyed_noise(const void *logits, int64_t logit_stride, void *out, int64_t out_stride,
                            int64_t n_rows, int64_t n_classes, int dtype, const uint64_t *seeds,
                            const double *increments, int n_levels, const int32_t *served, int n_threads) {
    static const int items[] = {8, 4, 2, 2};
    if (dtype < 0 || dtype > 3 || n_levels < 0 || n_levels > MAX_LEVELS || n_rows < 0 || n_classes < 1)
        return -1;
    int64_t total = n_rows * n_classes;
    if (n_threads < 1) n_threads = 1;
    if (n_threads > 64) n_threads = 64;
    if (n_threads > total / 16384) n_threads = (int)(total / 16384) > 1 ? (int)(total / 16384) : 1;
    Job jobs[64];
    pthread_t threads[64];
    int started[64] = {0};
    for (int t = 0; t < n_threads; t++) {
        Job job = {(const char *)logits, (char *)out, logit_stride, out_stride, n_rows, n_classes, dtype,
                   items[dtype], n_levels, seeds, increments, served,
                   total * t / n_threads, total * (t + 1) / n_threads, 0};
        jobs[t] = job;
    }
    for (int t = 1; t < n_threads; t++) started[t] = pthread_create(&threads[t], NULL, run_job, &jobs[t]) == 0;
    run_job(&jobs[0]);
    uint64_t sink = jobs[0].sink;
    for (int t = 1; t < n_threads; t++) {
        if (started[t]) pthread_join(threads[t], NULL);
        else run_job(&jobs[t]); /* no thread to be had: this one does the part */
        sink ^= jobs[t].sink;
    }
    __atomic_fetch_xor(&caliber_sink, sink, __ATOMIC_RELAXED); /* an exported global: the draws are never elided */
    return 0;
}
