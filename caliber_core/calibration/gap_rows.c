/* Full-vocabulary rows reduced in three passes over each row while it sits in cache: the top (and its
 * first index), the gap histogram folded to the reduction's bins, and every gap at or below the bin
 * where the m + 1 smallest end.
 *
 * The same numbers as caliber_core/calibration/gap_histogram.py's numpy path: a gap is the float32
 * difference top - z (one IEEE rounding, as numpy's), its bin its float32 bits shifted right, so the
 * counts are integers and the kept gaps the same floats. Built and loaded by gap_kernel.py; plain C,
 * no Python headers.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef __AVX2__
#include <immintrin.h>
#endif

#define KERNEL_ABI 1

static inline uint32_t bits_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

int caliber_gap_rows_abi(void) { return KERNEL_ABI; }

/* Sub-histograms a row is counted into (element j into j % N_SUB), summed into the first at the end: equal
 * bins in a run would otherwise wait on each other's increment. */
#define N_SUB 4

/* raw[0 .. hi_bin] (N_SUB sub-histograms of hi_bin + 1, zeroed) += each gap's bin, bins past hi_bin in hi_bin. */
static void count_bins(const float *z, int64_t v, float t, int shift, uint32_t hi_bin, uint32_t *raw) {
    const int64_t stride = (int64_t)hi_bin + 1;
    int64_t j = 0;
#ifdef __AVX2__
    const __m256 top = _mm256_set1_ps(t);
    const __m256i hi = _mm256_set1_epi32((int)hi_bin);
    uint32_t idx[8] __attribute__((aligned(32)));
    for (; j + 8 <= v; j += 8) {
        __m256i b = _mm256_srli_epi32(_mm256_castps_si256(_mm256_sub_ps(top, _mm256_loadu_ps(z + j))), shift);
        _mm256_store_si256((__m256i *)idx, _mm256_min_epu32(b, hi));
        raw[idx[0]]++; raw[stride + idx[1]]++; raw[2 * stride + idx[2]]++; raw[3 * stride + idx[3]]++;
        raw[idx[4]]++; raw[stride + idx[5]]++; raw[2 * stride + idx[6]]++; raw[3 * stride + idx[7]]++;
    }
#endif
    for (; j < v; j++) {
        uint32_t b = bits_of(t - z[j]) >> shift; /* gaps are >= +0.0 (+inf for a -inf logit) */
        raw[(j % N_SUB) * stride + (b < hi_bin ? b : hi_bin)]++;
    }
    for (int s = 1; s < N_SUB; s++)
        for (int64_t b = 0; b < stride; b++) raw[b] += raw[s * stride + b];
}

static int ascending(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

/* The gaps whose bin is at most `threshold`, in row order, into out (the first cap); how many there are. */
static int64_t gaps_at_or_below(const float *z, int64_t v, float t, int shift, uint32_t threshold, float *out,
                                int64_t cap) {
    int64_t k = 0, j = 0;
#ifdef __AVX2__
    if (threshold < (UINT32_MAX >> shift)) {
        /* bin(g) <= threshold exactly when bits(g) < (threshold + 1) << shift: one signed compare, as gaps
         * are >= +0.0 and their bits below 2^31. */
        const __m256 top = _mm256_set1_ps(t);
        const __m256i edge = _mm256_set1_epi32((int)((threshold + 1) << shift));
        for (; j + 8 <= v; j += 8) {
            __m256 g = _mm256_sub_ps(top, _mm256_loadu_ps(z + j));
            int mask = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(edge, _mm256_castps_si256(g))));
            while (mask) {
                int q = __builtin_ctz(mask);
                mask &= mask - 1;
                if (k < cap) out[k] = t - z[j + q];
                k++;
            }
        }
    }
#endif
    for (; j < v; j++) {
        float g = t - z[j];
        if ((bits_of(g) >> shift) <= threshold) {
            if (k < cap) out[k] = g;
            k++;
        }
    }
    return k;
}

/* The row's largest value; *bad set when a NaN is anywhere in it (numpy's max would be NaN). */
static float row_max(const float *z, int64_t v, int *bad) {
    int64_t j = 0;
    float top = z[0];
    int nan = 0;
#ifdef __AVX2__
    if (v >= 32) {
        __m256 m0 = _mm256_loadu_ps(z), m1 = m0, m2 = m0, m3 = m0;
        __m256 u = _mm256_setzero_ps();
        for (; j + 32 <= v; j += 32) {
            __m256 a = _mm256_loadu_ps(z + j), b = _mm256_loadu_ps(z + j + 8);
            __m256 c = _mm256_loadu_ps(z + j + 16), d = _mm256_loadu_ps(z + j + 24);
            u = _mm256_or_ps(u, _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
            u = _mm256_or_ps(u, _mm256_cmp_ps(c, d, _CMP_UNORD_Q));
            m0 = _mm256_max_ps(m0, a); m1 = _mm256_max_ps(m1, b);
            m2 = _mm256_max_ps(m2, c); m3 = _mm256_max_ps(m3, d);
        }
        m0 = _mm256_max_ps(_mm256_max_ps(m0, m1), _mm256_max_ps(m2, m3));
        float lanes[8];
        _mm256_storeu_ps(lanes, m0);
        nan = _mm256_movemask_ps(u) != 0;
        top = lanes[0];
        for (int k = 1; k < 8; k++) top = lanes[k] > top ? lanes[k] : top;
    }
#endif
    for (; j < v; j++) {
        float x = z[j];
        nan |= x != x;
        top = x > top ? x : top;
    }
    *bad = nan;
    return top;
}

/* rows: n rows of v float32, row i at rows + i * stride (in floats).
 * For each row: top[i] (the max; -0.0 made +0.0), pred[i] (its first index, when want_pred), counts
 * (n x n_bins int32: raw bin b = bits(gap) >> shift, bins from hi_bin on summed into hi_bin; raw bins
 * below lo_bin summed into column 0, raw bin b >= lo_bin into column b - lo_bin + 1), and near: the
 * gaps whose raw bin is at most the first one where the cumulative count reaches m1 (near_count[i] of
 * them). When they fit in cap, they are sorted, the m1 smallest taken out of the counts and all but the
 * first (the top's own 0) written to top_gaps (n x (m1 - 1) float64); otherwise the row's counts and
 * top_gaps are left for the caller (near holds the first cap gaps in row order).
 * Returns 0, or -(i + 1) for the first row whose max is NaN or +inf (a NaN anywhere makes it so),
 * -(n + 1) for arguments it cannot take. */
int64_t caliber_gap_rows(const float *rows, int64_t n, int64_t v, int64_t stride, int shift, int64_t lo_bin,
                         int64_t hi_bin, int64_t m1, int want_pred, float *top, int64_t *pred, int32_t *counts,
                         int64_t n_bins, float *near, int64_t cap, int64_t *near_count, double *top_gaps) {
    if (v < 1 || hi_bin < lo_bin || lo_bin < 1 || n_bins != hi_bin - lo_bin + 2 || m1 < 1) return -(n + 1);
    uint32_t *raw = malloc((size_t)N_SUB * (hi_bin + 1) * sizeof(uint32_t)); /* one per call: threads share none */
    if (raw == NULL) return -(n + 1);
    for (int64_t i = 0; i < n; i++) {
        const float *z = rows + i * stride;
        int bad;
        float t = row_max(z, v, &bad);
        if (bad || !(t - t == 0.0f)) { /* NaN, or +inf (inf - inf is NaN) */
            free(raw);
            return -(i + 1);
        }
        if (t == 0.0f) t = 0.0f; /* -0.0 -> +0.0: a tie at a zero top has gap +0.0 */
        top[i] = t;
        if (want_pred) {
            int64_t j = 0;
            while (!(z[j] == t)) j++;
            pred[i] = j;
        }
        memset(raw, 0, (size_t)N_SUB * (hi_bin + 1) * sizeof(uint32_t));
        count_bins(z, v, t, shift, (uint32_t)hi_bin, raw);
        int32_t *c = counts + i * n_bins;
        uint64_t below = 0, seen = 0;
        for (int64_t b = 0; b < lo_bin; b++) below += raw[b];
        c[0] = (int32_t)below;
        for (int64_t b = lo_bin; b <= hi_bin; b++) c[b - lo_bin + 1] = (int32_t)raw[b];
        int64_t threshold = hi_bin;
        for (int64_t b = 0; b <= hi_bin; b++) {
            seen += raw[b];
            if (seen >= (uint64_t)m1) { threshold = b; break; }
        }
        float *kept = near + i * cap;
        int64_t k = gaps_at_or_below(z, v, t, shift, threshold >= hi_bin ? UINT32_MAX : (uint32_t)threshold, kept,
                                     cap);
        if (k <= cap && k >= m1) {
            /* The m1 smallest, ascending (the top's own 0 first): kept from the histogram, the rest exact. */
            qsort(kept, (size_t)k, sizeof(float), ascending);
            for (int64_t q = 0; q < m1; q++) {
                uint32_t b = bits_of(kept[q]) >> shift;
                c[b < (uint32_t)lo_bin ? 0 : (b < (uint32_t)hi_bin ? b : (uint32_t)hi_bin) - lo_bin + 1]--;
                if (q) top_gaps[i * (m1 - 1) + q - 1] = (double)kept[q];
            }
        }
        near_count[i] = k;
    }
    free(raw);
    return 0;
}
