/* The agreement bounds of reduced full-vocabulary rows (Eq. top1-exact) at one sigma, one pass a row.
 *
 * For each row and quadrature node u the kept gaps g_j (ascending) enter exactly, as
 * prod_j Phi(g_j / sigma + u) up to the first factor that is 1.0 in float64 (x >= phi_one); the tail bins
 * enter through the row's lower and upper log-sums, made by the caller (a float32 product of the bin
 * counts by log_phi_table's edges). The row's bounds are sum_u w_u exp(log(head) + tail), as in
 * caliber_core/calibration/gap_histogram.py's numpy path, with two differences:
 *
 * - the head's factors are Phi read from a cubic Hermite table (step 2^-8, values and slopes from the C
 *   library's erf/erfc), within PHI_TABLE_ERROR of Phi: several times cheaper than erfc. All factors lie
 *   in [0, 1], so the product moves by at most that times the factors taken: the lower bound's head is
 *   lowered and the upper bound's raised by it, and the bounds stay bounds, each at most
 *   32 x PHI_TABLE_ERROR ~ 1.3e-11 wider;
 * - the tail tables' log Phi is the C library's, split as scipy's log_ndtr.
 *
 * Built and loaded by bound_kernel.py; plain C, no Python headers.
 */
#include <math.h>
#include <stdint.h>

#define KERNEL_ABI 2

int caliber_bound_rows_abi(void) { return KERNEL_ABI; }

/* Phi(x), split as scipy's ndtr: erf near 0, erfc in the tails (no cancellation on either side). */
static inline double phi(double x) {
    const double sqrth = 0.70710678118654752440;
    double z = x * sqrth;
    if (fabs(z) < sqrth) return 0.5 + 0.5 * erf(z);
    double y = 0.5 * erfc(fabs(z));
    return z > 0 ? 1.0 - y : y;
}

/* The table: cell k covers [TABLE_X0 + k h, TABLE_X0 + (k + 1) h) with h = 2^-TABLE_BITS, up to TABLE_X1. */
#define TABLE_BITS 8
#define TABLE_X0 (-8.5)
#define TABLE_X1 8.5
#define TABLE_CELLS ((int)((TABLE_X1 - TABLE_X0) * (1 << TABLE_BITS)))
/* The cubic Hermite remainder, max|Phi^(4)| h^4 / 384 = 0.5506 x 2^-32 / 384 = 3.34e-13, with room for the
 * rounding of the coefficients, of x + 8.5 and of Horner's rule (~1e-15 each). */
#define PHI_TABLE_ERROR 4e-13
static double table[TABLE_CELLS][4];

double caliber_phi_table_error(void) { return PHI_TABLE_ERROR; }

/* Fill the table (once, before any row is bounded: bound_kernel.py calls it on load). */
void caliber_bound_rows_init(void) {
    const double h = 1.0 / (1 << TABLE_BITS), pdf0 = 0.39894228040143267794;
    for (int k = 0; k < TABLE_CELLS; k++) {
        double x0 = TABLE_X0 + k * h, x1 = x0 + h;
        double y0 = phi(x0), y1 = phi(x1);
        double d0 = h * pdf0 * exp(-0.5 * x0 * x0), d1 = h * pdf0 * exp(-0.5 * x1 * x1);
        table[k][0] = y0;
        table[k][1] = d0;
        table[k][2] = 3.0 * (y1 - y0) - 2.0 * d0 - d1;
        table[k][3] = 2.0 * (y0 - y1) + d0 + d1;
    }
}

/* Phi(x) within PHI_TABLE_ERROR, in [0, 1]; the C library's outside the table. */
static inline double phi_read(double x) {
    if (!(x >= TABLE_X0 && x < TABLE_X1)) return phi(x);
    double t = (x - TABLE_X0) * (1 << TABLE_BITS);
    int k = (int)t;
    double f = t - k;
    const double *c = table[k];
    double y = ((c[3] * f + c[2]) * f + c[1]) * f + c[0];
    return y < 0.0 ? 0.0 : (y > 1.0 ? 1.0 : y);
}

/* Phi(x) read from the table (for the tests): out[i] for x[i]. */
void caliber_phi_read(const double *x, int64_t n, double *out) {
    for (int64_t i = 0; i < n; i++) out[i] = phi_read(x[i]);
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
 * (n_rows x n_nodes, float32, row-major): lower[i], upper[i] = sum_u w_u exp(log head + tail), the head
 * moved down (lower) or up (upper) by what the table's reads may be off, within [1e-300, 1]. */
void caliber_agreement_rows(const double *gaps, int64_t n_rows, int64_t stride, int64_t kept, double sigma,
                            const double *nodes, const double *weights, int64_t n_nodes, double phi_one,
                            const float *lo_tail, const float *hi_tail, double *lower, double *upper) {
    for (int64_t i = 0; i < n_rows; i++) {
        const double *g = gaps + i * stride;
        const float *lo = lo_tail + i * n_nodes, *hi = hi_tail + i * n_nodes;
        double sum_lo = 0.0, sum_hi = 0.0;
        for (int64_t u = 0; u < n_nodes; u++) {
            double p = 1.0;
            int64_t j = 0;
            for (; j < kept; j++) {
                double x = g[j] / sigma + nodes[u];
                if (!(x < phi_one)) break; /* 1.0 from here on: the gaps ascend */
                p *= phi_read(x);
            }
            /* |prod a_j - prod b_j| <= sum |a_j - b_j| for factors in [0, 1]: the j reads move it so much */
            double slack = (double)j * PHI_TABLE_ERROR, p_lo = p - slack, p_hi = p + slack;
            double head_lo = log(p_lo > 1e-300 ? p_lo : 1e-300), head_hi = log(p_hi < 1.0 ? p_hi : 1.0);
            sum_lo += weights[u] * exp(head_lo + (double)lo[u]);
            sum_hi += weights[u] * exp(head_hi + (double)hi[u]);
        }
        lower[i] = sum_lo;
        upper[i] = sum_hi;
    }
}
