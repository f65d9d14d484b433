/* The agreement bounds of reduced full-vocabulary rows (Eq. top1-exact) at one sigma, one pass a row.
 *
 * For each row and quadrature node u the kept gaps g_j (ascending) enter exactly, as
 * prod_j Phi(g_j / sigma + u) up to the first factor that is 1.0 in float64 (x >= phi_one); the tail bins
 * enter through the row's lower and upper log-sums, made by the caller (a float32 product of the bin
 * counts by log_phi_table's edges). The row's bounds are sum_u w_u exp(log(head) + tail). The same
 * operations as caliber_core/calibration/gap_histogram.py's numpy path, with the C library's erf/erfc
 * for the normal CDF in place of scipy's (both within a few ulp of the exact value). Built and loaded by
 * bound_kernel.py; plain C, no Python headers.
 */
#include <math.h>
#include <stdint.h>

#define KERNEL_ABI 1

int caliber_bound_rows_abi(void) { return KERNEL_ABI; }

/* Phi(x), split as scipy's ndtr: erf near 0, erfc in the tails (no cancellation on either side). */
static inline double phi(double x) {
    const double sqrth = 0.70710678118654752440;
    double z = x * sqrth;
    if (fabs(z) < sqrth) return 0.5 + 0.5 * erf(z);
    double y = 0.5 * erfc(fabs(z));
    return z > 0 ? 1.0 - y : y;
}

/* log Phi(x), split as scipy's log_ndtr above -20: -Phi(-x) past 6 (log1p's first term, exact in
 * float64 there), else the log of Phi (erfc keeps its relative accuracy down to x = -37). */
static inline double log_phi(double x) { return x > 6.0 ? -phi(-x) : log(phi(x)); }

/* out[e * n_nodes + u] = (float) log Phi(edges[e] / sigma + nodes[u]). */
void caliber_log_phi_table(const double *edges, int64_t n_edges, const double *nodes, int64_t n_nodes, double sigma,
                           float *out) {
    for (int64_t e = 0; e < n_edges; e++) {
        double a = edges[e] / sigma;
        for (int64_t u = 0; u < n_nodes; u++) out[e * n_nodes + u] = (float)log_phi(a + nodes[u]);
    }
}

/* Rows [0, n_rows) of gaps (row stride `stride` doubles, the first `kept` ascending), their tails lo/hi
 * (n_rows x n_nodes, float32, row-major): lower[i], upper[i] = sum_u w_u exp(log max(head, 1e-300) + tail). */
void caliber_agreement_rows(const double *gaps, int64_t n_rows, int64_t stride, int64_t kept, double sigma,
                            const double *nodes, const double *weights, int64_t n_nodes, double phi_one,
                            const float *lo_tail, const float *hi_tail, double *lower, double *upper) {
    for (int64_t i = 0; i < n_rows; i++) {
        const double *g = gaps + i * stride;
        const float *lo = lo_tail + i * n_nodes, *hi = hi_tail + i * n_nodes;
        double sum_lo = 0.0, sum_hi = 0.0;
        for (int64_t u = 0; u < n_nodes; u++) {
            double p = 1.0;
            for (int64_t j = 0; j < kept; j++) {
                double x = g[j] / sigma + nodes[u];
                if (!(x < phi_one)) break; /* 1.0 from here on: the gaps ascend */
                p *= phi(x);
            }
            double head = log(p > 1e-300 ? p : 1e-300);
            sum_lo += weights[u] * exp(head + (double)lo[u]);
            sum_hi += weights[u] * exp(head + (double)hi[u]);
        }
        lower[i] = sum_lo;
        upper[i] = sum_hi;
    }
}
