/* DeepSeek-V3's pieces of multi-head latent attention (docs/deepseek.md):
 * rotary embedding on a slice of each head with adjacent pairing, YaRN's
 * rotary tables, and the per-head keys and values assembled from
 * kv_b_proj's output and the one rotary key every head shares. The
 * projections, the LoRA norms (rmsnorm_forward with eps 1e-6) and the
 * attention itself are the kernels of nn.c and matmul.c. */
#include <math.h>
#include <string.h>

#include "kernels/kernels.h"

/* ---- rotary embedding, adjacent pairs ---- */

void rope_adj_forward(float *out, const float *inp, const float *cos_t, const float *sin_t,
		      int B, int T, int H, int D, int off, int Dr)
{
	// inp, out (B,T,H,D); cos_t, sin_t (T, Dr/2); out may equal inp
	int half = Dr / 2;
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
			for (int h = 0; h < H; h++) {
				size_t o = (((size_t)b * T + t) * H + h) * D;
				const float *x = inp + o;
				float *y = out + o;
				if (y != x) {
					memcpy(y, x, sizeof(float) * (size_t)off);
					memcpy(y + off + Dr, x + off + Dr, sizeof(float) * (size_t)(D - off - Dr));
				}
				for (int i = 0; i < half; i++) {
					float x1 = x[off + 2 * i], x2 = x[off + 2 * i + 1];
					y[off + 2 * i] = x1 * c[i] - x2 * s[i];
					y[off + 2 * i + 1] = x2 * c[i] + x1 * s[i];
				}
			}
		}
}

void rope_adj_backward(float *dinp, const float *dout, const float *cos_t, const float *sin_t,
		       int B, int T, int H, int D, int off, int Dr)
{
	// dout, dinp (B,T,H,D); cos_t, sin_t (T, Dr/2)
	int half = Dr / 2;
	if (!dinp)
		return;
	for (int b = 0; b < B; b++)
		for (int t = 0; t < T; t++) {
			const float *c = cos_t + (size_t)t * half, *s = sin_t + (size_t)t * half;
			for (int h = 0; h < H; h++) {
				size_t o = (((size_t)b * T + t) * H + h) * D;
				const float *g = dout + o;
				float *dx = dinp + o;
				for (int i = 0; i < off; i++)
					dx[i] += g[i];
				for (int i = off + Dr; i < D; i++)
					dx[i] += g[i];
				for (int i = 0; i < half; i++) {
					float g1 = g[off + 2 * i], g2 = g[off + 2 * i + 1];
					dx[off + 2 * i] += g1 * c[i] + g2 * s[i];
					dx[off + 2 * i + 1] += g2 * c[i] - g1 * s[i];
				}
			}
		}
}

/* ---- YaRN ---- */

float rope_yarn_mscale(float factor, float mscale)
{
	if (factor <= 1.0f)
		return 1.0f;
	return (float)(0.1 * mscale * log((double)factor) + 1.0);
}

/* the (fractional) dimension pair whose wavelength turns `rotations`
 * times in `orig` positions */
static double yarn_dim(double rotations, int D, double theta, int orig)
{
	return D * log(orig / (rotations * 2.0 * M_PI)) / (2.0 * log(theta));
}

void rope_table_yarn(float *cos_t, float *sin_t, int T, int D, float theta, float factor, int orig,
		     float beta_fast, float beta_slow, float mult)
{
	// cos_t, sin_t (T, D/2); angles in double, positions up to T-1
	int half = D / 2;
	double low = floor(yarn_dim(beta_fast, D, theta, orig));
	double high = ceil(yarn_dim(beta_slow, D, theta, orig));
	low = low > 0 ? low : 0;
	high = high < D - 1 ? high : D - 1;
	if (low == high)
		high += 0.001;
	for (int i = 0; i < half; i++) {
		double extra = pow((double)theta, -2.0 * i / D), inter = extra / factor;
		double ramp = (i - low) / (high - low);
		ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
		/* ramp 0: the high frequencies kept; 1: the low ones interpolated */
		double inv_freq = inter * ramp + extra * (1.0 - ramp);
		for (int t = 0; t < T; t++) {
			double a = t * inv_freq;
			cos_t[(size_t)t * half + i] = (float)(cos(a) * mult);
			sin_t[(size_t)t * half + i] = (float)(sin(a) * mult);
		}
	}
}

/* ---- keys and values of latent attention ---- */

void mla_kv_forward(float *k, float *v, const float *kvb, const float *kr, int N, int H, int Dn, int Dr,
		    int Dv)
{
	// kvb (N,H,Dn+Dv), kr (N,Dr) -> k (N,H,Dn+Dr), v (N,H,Dv)
	int Dk = Dn + Dr, Db = Dn + Dv;
	for (int n = 0; n < N; n++)
		for (int h = 0; h < H; h++) {
			const float *src = kvb + ((size_t)n * H + h) * Db;
			float *kh = k + ((size_t)n * H + h) * Dk;
			memcpy(kh, src, sizeof(float) * (size_t)Dn);
			memcpy(kh + Dn, kr + (size_t)n * Dr, sizeof(float) * (size_t)Dr);
			memcpy(v + ((size_t)n * H + h) * Dv, src + Dn, sizeof(float) * (size_t)Dv);
		}
}

void mla_kv_backward(float *dkvb, float *dkr, const float *dk, const float *dv, int N, int H, int Dn,
		     int Dr, int Dv)
{
	// dk (N,H,Dn+Dr), dv (N,H,Dv) -> dkvb (N,H,Dn+Dv), dkr (N,Dr)
	int Dk = Dn + Dr, Db = Dn + Dv;
	for (int n = 0; n < N; n++)
		for (int h = 0; h < H; h++) {
			const float *gk = dk + ((size_t)n * H + h) * Dk;
			const float *gv = dv + ((size_t)n * H + h) * Dv;
			if (dkvb) {
				float *g = dkvb + ((size_t)n * H + h) * Db;
				for (int i = 0; i < Dn; i++)
					g[i] += gk[i];
				for (int i = 0; i < Dv; i++)
					g[Dn + i] += gv[i];
			}
			if (dkr)
				for (int i = 0; i < Dr; i++)
					dkr[(size_t)n * Dr + i] += gk[Dn + i];
		}
}
