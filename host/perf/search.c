/* --search (see perf.h): every mesh and schedule this model can take on
 * hosts x dph devices, predicted, the fastest that fit printed. The
 * candidates: tensor parallelism inside a host (a divisor of its
 * devices), the rest of a host's devices FSDP; stages over hosts (a
 * divisor of the hosts and of the pipelined layers), the remaining hosts
 * data or FSDP; circular (all repeats), 1f1b, interleaved_1f1b (two
 * chunks), zb_h1 (as 1f1b, the backward split) and zbv (two chunks in a
 * V) at M = S, 2S, 4S, 8S; recompute on and off. The zero-bubble ones
 * hold a W stash per weight gradient they owe (perf_predict's memory),
 * so a --mem-gb limit can drop them where 1f1b fits. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/perf/perf.h"
#include "host/pipeline/pipe_config.h"

struct cand {
	char desc[200];
	struct perf_parts p;
};

static int cmp_cand(const void *a, const void *b)
{
	const struct cand *x = a, *y = b;
	return x->p.step < y->p.step ? -1 : x->p.step > y->p.step;
}

/* c with the overrides applied and finished for hosts x dph; 0 or -EINVAL. */
static int variant(struct cfg *out, const struct cfg *c, int hosts, int dph, const char *const *kv, int nkv)
{
	char err[512];
	*out = *c;
	for (int i = 0; i < nkv; i++)
		if (cfg_override(out, kv[i], err, sizeof(err)))
			return -EINVAL;
	return cfg_finish(out, hosts, dph, err, sizeof(err));
}

static int divisors(int n, int *out, int max)
{
	int k = 0;
	for (int i = 1; i <= n && k < max; i++)
		if (n % i == 0)
			out[k++] = i;
	return k;
}

int perf_search(const struct cfg *c, int hosts, int dph, const struct perf_machine *mc, int top, char *err,
		size_t errlen)
{
	static const char *const scheds[] = { "circular", "1f1b", "interleaved_1f1b", "zb_h1", "zbv" };
	enum { NSCHED = sizeof(scheds) / sizeof(scheds[0]) };
	struct model_dims d;
	int rc = model_dims_from_cfg(&d, c, err, errlen), cap = 4096, n = 0, tps[16], sts[64];
	if (rc)
		return rc;
	struct cand *cs = malloc(sizeof(*cs) * (size_t)cap);
	struct cfg *v = malloc(sizeof(*v));
	if (!cs || !v) {
		free(cs);
		free(v);
		return -ENOMEM;
	}
	int ntp = divisors(dph, tps, 16), nst = divisors(hosts, sts, 64);
	int layers = d.L_moe ? d.L_moe : d.L;
	for (int a = 0; a < ntp; a++)
		for (int b = 0; b < nst; b++)
			for (int rest = 0; rest < 2; rest++)
				for (int k = 0; k < NSCHED; k++)
					for (int mm = 1; mm <= 8; mm *= 2)
						for (int rcmp = 0; rcmp < 2 && n < cap; rcmp++) {
							int tp = tps[a], S = sts[b], R = hosts / S;
							if (S == 1 && (k || mm > 1))
								continue;
							bool two = k == 2 || k == 4;  /* two chunks a stage */
							if (layers % S || (two && layers % (2 * S)))
								continue;
							char kv[10][64];
							const char *kvp[10];
							int nk = 0;
							snprintf(kv[nk++], 64, "ici_tensor_parallelism=%d", tp);
							snprintf(kv[nk++], 64, "ici_fsdp_parallelism=%d", dph / tp);
							snprintf(kv[nk++], 64, "ici_data_parallelism=1");
							snprintf(kv[nk++], 64, "dcn_pipeline_parallelism=%d", S);
							snprintf(kv[nk++], 64, "dcn_data_parallelism=%d", rest ? 1 : R);
							snprintf(kv[nk++], 64, "dcn_fsdp_parallelism=%d", rest ? R : 1);
							snprintf(kv[nk++], 64, "pipeline_schedule=%s", scheds[k]);
							snprintf(kv[nk++], 64, "num_pipeline_microbatches=%d", S > 1 ? mm * S : -1);
							snprintf(kv[nk++], 64, "num_layers_per_pipeline_stage=%d",
								 k == 0 ? 1 : two ? layers / (2 * S) : layers / S);
							snprintf(kv[nk++], 64, "pipeline_recompute=%s", rcmp ? "false" : "true");
							for (int i = 0; i < nk; i++)
								kvp[i] = kv[i];
							if (variant(v, c, hosts, dph, kvp, nk))
								continue;
							struct cand *x = &cs[n];
							char e2[256];
							if (perf_predict(v, mc, NULL, &x->p, e2, sizeof(e2)) ||
							    (mc->mem_bytes > 0 && x->p.mem_total > mc->mem_bytes))
								continue;
							if (S > 1)
								snprintf(x->desc, sizeof(x->desc), "tensor=%d fsdp=%d data=%d stage=%d %s v=%d "
									 "M=%d recompute=%s", tp, dph / tp * (rest ? R : 1), rest ? 1 : R,
									 S, scheds[k], x->p.chunks, x->p.microbatches, rcmp ? "off" : "on");
							else if (rcmp)
								continue;  /* no pipeline: no recompute to choose */
							else
								snprintf(x->desc, sizeof(x->desc), "tensor=%d fsdp=%d data=%d, no pipeline",
									 tp, dph / tp * (rest ? R : 1), rest ? 1 : R);
							n++;
						}
	qsort(cs, (size_t)n, sizeof(*cs), cmp_cand);
	printf("search: %d configurations fit (of the candidates), the %d fastest:\n", n, n < top ? n : top);
	printf("  %-78s %10s %9s %9s %9s %9s\n", "configuration", "step s", "bubble", "tail s", "opt s",
	       "mem GiB");
	for (int i = 0; i < n && i < top; i++)
		printf("  %-78s %10.3f %9.3f %9.3f %9.3f %9.1f\n", cs[i].desc, cs[i].p.step, cs[i].p.bubble,
		       cs[i].p.tail, cs[i].p.optimizer, cs[i].p.mem_total / (1 << 30));
	if (!n) {
		snprintf(err, errlen, "no configuration of %d hosts x %d devices fits %.1f GiB a device",
			 hosts, dph, mc->mem_bytes / (1 << 30));
		rc = -EINVAL;
	}
	free(cs);
	free(v);
	return rc;
}
