/* `meshrun plan`: the step time and memory the step-time model
 * (host/perf/perf.h) predicts for a config on a mesh, from figures
 * measured here (a layer of the model at its microbatch, unless --flops
 * is given) and the links given; with --search, the fastest
 * configurations of the model for that many hosts. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/cli/args.h"
#include "host/cli/cli.h"
#include "host/config/config.h"
#include "host/perf/perf.h"

#define END_FLAGS { NULL, 0, NULL, 0, 0, NULL }
/* seconds --cores auto runs the devices' threads at once first */
#define AUTO_S 1.0

struct plan_args {
	int hosts, dph, threads, top;
	const char *cores, *iw, *costs_from, *costs_by;
	double link_gbps, link_us, ici_gbps, ici_us, flops, mem_gb;
	bool search;
};

/* The prediction's parts: the table, the tail, the optimizer; the
 * schedule; the work a step, by action kind. */
static void print_parts(const struct perf_parts *p)
{
	printf("parts: table %.4f s (its busiest device has %.4f s of compute, run in %.4f s; idle %.3f of the "
	       "worst device's span: the bubble and waits for transfers and gathers), gradient sums after it "
	       "%.4f s, optimizer %.4f s", p->table, p->compute, p->running, p->bubble, p->tail, p->optimizer);
	if (p->muon_ns > 0)
		printf(" (of it Muon's Newton-Schulz %.4f s: each matrix once over its group)", p->muon_ns);
	printf("\n");
	printf("schedule: S=%d stages, v=%d chunks a stage, M=%d microbatches of %d rows\n", p->stages, p->chunks,
	       p->microbatches, p->mb_rows);
	printf("work: %.4f s of compute and optimizer a step over every device (at full speed)\n", p->work);
	double table = 0;
	for (int k = 0; k < PERF_KINDS; k++)
		table += p->work_kind[k];
	printf("work by action: F=%.2f,B=%.2f,I=%.2f,W=%.2f,own=%.2f,xfer=%.2f s, optimizer %.2f s\n",
	       p->work_kind[PERF_F], p->work_kind[PERF_B], p->work_kind[PERF_I], p->work_kind[PERF_W],
	       p->work_kind[PERF_OWN], p->work_kind[PERF_XFER], p->work - table);
}

/* Each stage in the model's timeline against the run's. */
static void print_stages(const struct perf_parts *p)
{
	for (int s = 0; s < p->stages && s < PERF_STAGES; s++)
		printf("stage %d: plan compute %.4f s, last end %.4f s; run compute %.4f s CPU in %.4f s wall, last end "
		       "%.4f s (%+.1f%%)\n", s, p->stage_busy[s], p->stage_end[s], p->run_cpu[s], p->run_wall[s],
		       p->run_end[s], p->run_end[s] > 0 ? 100 * (p->stage_end[s] - p->run_end[s]) / p->run_end[s] : 0);
}

static void print_prediction(const struct perf_parts *p, const struct perf_compute *pc, bool measured)
{
	printf("predicted_step_s: %.4f\n", p->step);
	print_parts(p);
	printf("compute per microbatch (%d rows, %s): layer forward %.2f ms, backward %.2f ms (split: I %.2f ms, "
	       "W %.2f ms)%s; head %.2f ms\n", pc->rows, measured ? "measured here" : "from --flops",
	       1e3 * pc->f_layer[0], 1e3 * pc->b_layer[0], 1e3 * pc->i_layer[0], 1e3 * pc->w_layer[0],
	       pc->f_layer[1] != pc->f_layer[0] ? " (dense)" : "", 1e3 * pc->head);
	if (pc->f_beside > 0)
		printf("  the devices beside ran the layer forward in %.2f ms a call meanwhile\n", 1e3 * pc->f_beside);
	if (pc->xfer_send > 0 || pc->xfer_recv > 0)
		printf("transfers' CPU (AES-128-GCM, 16 KiB records, a socket pair): sender %.3f ns, receiver %.3f ns "
		       "a byte\n", 1e9 * pc->xfer_send, 1e9 * pc->xfer_recv);
	if (pc->f_layer[1] != pc->f_layer[0])
		printf("  MoE layer forward %.2f ms, backward %.2f ms (split: I %.2f ms, W %.2f ms)\n",
		       1e3 * pc->f_layer[1], 1e3 * pc->b_layer[1], 1e3 * pc->i_layer[1], 1e3 * pc->w_layer[1]);
	double G = 1 << 30;
	printf("memory per device: %.3f GiB (parameters %.3f, gradients %.3f, optimizer %.3f, weight window %.3f, "
	       "activations %.3f)\n", p->mem_total / G, p->mem_params / G, p->mem_grads / G, p->mem_opt / G,
	       p->mem_window / G, p->mem_act / G);
}

/* --costs-from: the run's own figures beside the prediction, and each
 * stage's end in both (the model's timeline against the run's). */
static void print_run(const struct perf_parts *p, const struct perf_trace *tr, const char *path, double cores,
		      enum perf_run_by by)
{
	static const char *const how[] = {
		[PERF_RUN_KIND] = "its kind's mean CPU on its stage in the run",
		[PERF_RUN_ACTION] = "its own mean CPU over the steps in the run",
		[PERF_RUN_WALL] = "its own mean wall time over the steps in the run",
	};
	printf("costs: from '%s' (steps %d-%d): each action %s; cores ", path, tr->step0, tr->step1, how[by]);
	if (cores > 0)
		printf("%.2f%s\n", cores, cores == tr->cores ? " (the run's, fitted to its compute spans)" : "");
	else
		printf("not shared (the walls have the sharing in them)\n");
	printf("transfers: %s%s\n",
	       p->xfer_by == PERF_XFER_TRACED ? "each send and receive its traced CPU (the stage's mean)" :
	       p->xfer_by == PERF_XFER_UNTRACED ? "each send its device's untraced time over its sends (a trace "
						  "without the transfers' CPU)" :
	       "not charged (a trace without the transfers' CPU)",
	       p->xfer_by == PERF_XFER_TRACED && tr->exec_traced ?
	       ", with the executor's: a receive its share of posting ahead, a send its share of the send waits" : "");
	printf("run_step_s: %.4f\n", tr->step_s);
	printf("run: step %.4f s (plan %+.1f%%), forward+backward %.4f s (plan's table %.4f s, %+.1f%%), optimizer "
	       "%.4f s\n", tr->step_s, tr->step_s > 0 ? 100 * (p->step - tr->step_s) / tr->step_s : 0, tr->fb_s,
	       p->table, tr->fb_s > 0 ? 100 * (p->table - tr->fb_s) / tr->fb_s : 0, tr->opt_s);
}

/* --costs-by: kind, action or wall, or -1 */
static int run_by(const char *v)
{
	return !strcmp(v, "kind") ? PERF_RUN_KIND : !strcmp(v, "action") ? PERF_RUN_ACTION :
	       !strcmp(v, "wall") ? PERF_RUN_WALL : -1;
}

/* --cores N, or auto: measured with the devices' threads at once. */
static int cores_of(const char *v, const struct cfg *c, int mb, int devs, double *out)
{
	char *end;
	if (!strcmp(v, "auto")) {
		*out = perf_measure_cores(c, mb, 1, devs, AUTO_S);
		return *out > 0 ? 0 : -EINVAL;
	}
	*out = strtod(v, &end);
	return *end || *out <= 0 ? -EINVAL : 0;
}

/* --iw I,W: the split backward's parts as fractions of B. */
static int iw_of(const char *v, struct perf_machine *mc)
{
	char *end;
	mc->i_frac = strtod(v, &end);
	if (*end != ',')
		return -EINVAL;
	mc->w_frac = strtod(end + 1, &end);
	return *end || mc->i_frac <= 0 || mc->w_frac <= 0 || mc->i_frac > 10 || mc->w_frac > 10 ? -EINVAL : 0;
}

static int plan(const struct plan_args *pa, const struct args *a)
{
	char err[1024];
	struct cfg *c = malloc(sizeof(*c));
	int rc = c ? args_load_cfg(a, c, err, sizeof(err)) : -ENOMEM;
	struct perf_machine mc = {
		.dcn = { pa->link_gbps * 1e9 / 8, pa->link_us * 1e-6 },
		.ici = { pa->ici_gbps * 1e9 / 8, pa->ici_us * 1e-6 },
		.flops = pa->flops, .mem_bytes = pa->mem_gb * (double)(1 << 30),
	};
	if (!rc && pa->iw && (rc = iw_of(pa->iw, &mc)))
		snprintf(err, sizeof(err), "--iw takes I/B,W/B (e.g. 0.52,0.46), got '%s'", pa->iw);
	int hosts = pa->hosts ? pa->hosts : cfg_family_product(c, true);
	int dph = pa->dph ? pa->dph : cfg_family_product(c, false);
	if (!rc && pa->search) {
		rc = perf_search(c, hosts, dph, &mc, pa->top, err, sizeof(err));
	} else if (!rc && !(rc = cfg_finish(c, hosts, dph, err, sizeof(err)))) {
		struct perf_compute pcm, *pc = NULL;
		struct perf_trace tr = { 0 };
		struct model_dims d;
		struct perf_parts p;
		int mb = 0;
		if (!(rc = model_dims_from_cfg(&d, c, err, sizeof(err))) && (mb = perf_mb_rows(c, &d, err, sizeof(err))) < 0)
			rc = mb;
		int devs = hosts * dph, th = pa->threads;
		if (!rc && pa->cores && (rc = cores_of(pa->cores, c, mb, devs, &mc.cores)))
			snprintf(err, sizeof(err), "--cores takes a count or auto, got '%s'", pa->cores);
		if (!rc && pa->costs_from) {
			/* the run's own costs: nothing measured here */
			if (!(rc = perf_trace_read(pa->costs_from, &tr, err, sizeof(err))))
				mc.run = &tr;
			mc.run_by = pa->costs_by ? (enum perf_run_by)run_by(pa->costs_by) : PERF_RUN_KIND;
			memset(&pcm, 0, sizeof(pcm));
		} else if (!rc && pa->flops <= 0) {
			/* one device's OpenBLAS threads, as an agent gets them */
			if (!th)
				th = mc.cores > devs ? (int)(mc.cores / devs) : 1;
			/* beside the other devices of its machine, as in a run:
			 * with --cores every device shares this one */
			rc = perf_measure(c, mb, th, (pa->cores ? devs : dph) - 1, &pcm, err, sizeof(err));
			pc = &pcm;
			/* --cores auto: with what the devices' threads got while
			 * the layer was measured (every device computed then too),
			 * weighted by seconds: a longer look at the machine's load */
			if (!rc && pa->cores && !strcmp(pa->cores, "auto") && pcm.cores_seen > 0 && pcm.cores_window > 0)
				mc.cores = (AUTO_S * mc.cores + pcm.cores_window * pcm.cores_seen) /
					   (AUTO_S + pcm.cores_window);
		} else if (!rc) {
			perf_analytic(&d, mb, pa->flops, &pcm);
		}
		if (!rc)
			rc = perf_predict(c, &mc, pc, &p, err, sizeof(err));
		if (!rc && mc.run) {
			printf("predicted_step_s: %.4f\n", p.step);
			print_run(&p, &tr, pa->costs_from, mc.cores > 0 ? mc.cores : mc.run_by == PERF_RUN_WALL ? 0 : tr.cores,
				  mc.run_by);
			print_parts(&p);
			print_stages(&p);
		} else if (!rc) {
			print_prediction(&p, &pcm, pc != NULL);
			if (mc.cores > 0)
				printf("cores: the %d devices share %.2f cores%s", devs, mc.cores,
				       strcmp(pa->cores, "auto") ? "" : " (measured: devices running a layer at once");
			if (mc.cores > 0 && !strcmp(pa->cores, "auto"))
				printf(", for %.1f s%s)", AUTO_S + (pc ? pcm.cores_window : 0),
				       pc && pcm.cores_window > 0 ? ", then while the layer was measured" : "");
			if (mc.cores > 0)
				printf("\n");
			/* given cores: what the machine gave while measuring, to set
			 * beside them (the same window --cores auto weighs in) */
			if (pc && pcm.cores_seen > 0 && pa->cores && strcmp(pa->cores, "auto"))
				printf("cores seen: the %d devices' threads got %.2f cores while the layer was measured "
				       "(%.1f s)\n", devs, pcm.cores_seen, pcm.cores_window);
		}
		perf_trace_release(&tr);
	}
	if (rc)
		cli_error("plan", "%s", rc == -ENOMEM ? "out of memory" : err);
	free(c);
	return cli_exit_code(rc);
}

int cmd_plan(int argc, char **argv)
{
	struct plan_args pa = { .link_gbps = 10, .link_us = 50, .ici_gbps = 80, .ici_us = 10, .top = 5 };
	const struct arg_flag flags[] = {
		{ "--config", ARG_CONFIG, NULL, 0, 0, NULL },
		{ "--hosts", ARG_INT, &pa.hosts, 1, 1 << 20, NULL },
		{ "--devices-per-host", ARG_INT, &pa.dph, 1, 4096, NULL },
		{ "--link-gbps", ARG_DOUBLE, &pa.link_gbps, 1e-3, 1e6, NULL },
		{ "--link-latency-us", ARG_DOUBLE, &pa.link_us, 0, 1e7, NULL },
		{ "--ici-gbps", ARG_DOUBLE, &pa.ici_gbps, 1e-3, 1e7, NULL },
		{ "--ici-latency-us", ARG_DOUBLE, &pa.ici_us, 0, 1e7, NULL },
		{ "--flops", ARG_DOUBLE, &pa.flops, 1e6, 1e20, NULL },
		{ "--cores", ARG_STR, &pa.cores, 0, 0, NULL },
		{ "--threads", ARG_INT, &pa.threads, 1, 1024, NULL },
		{ "--iw", ARG_STR, &pa.iw, 0, 0, NULL },
		{ "--costs-from", ARG_STR, &pa.costs_from, 0, 0, NULL },
		{ "--costs-by", ARG_STR, &pa.costs_by, 0, 0, NULL },
		{ "--search", ARG_BOOL, &pa.search, 0, 0, NULL },
		{ "--top", ARG_INT, &pa.top, 1, 1000, NULL },
		{ "--mem-gb", ARG_DOUBLE, &pa.mem_gb, 0, 1e9, NULL },
		END_FLAGS,
	};
	const struct arg_flag *const tables[] = { flags, NULL };
	struct args a;
	char err[256];
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (!rc && !a.nconfigs) {
		snprintf(err, sizeof(err), "--config FILE is needed");
		rc = -EINVAL;
	}
	if (!rc && pa.costs_from && (pa.search || pa.flops > 0 || pa.iw)) {
		snprintf(err, sizeof(err), "--costs-from takes its figures from the trace: not with --search, --flops or --iw");
		rc = -EINVAL;
	}
	if (!rc && pa.costs_by && (!pa.costs_from || run_by(pa.costs_by) < 0)) {
		snprintf(err, sizeof(err), "--costs-by takes kind, action or wall, with --costs-from TRACE; got '%s'",
			 pa.costs_by);
		rc = -EINVAL;
	}
	if (!rc && pa.search && pa.flops <= 0) {
		snprintf(err, sizeof(err), "--search needs --flops (the devices of a cluster not measured here)");
		rc = -EINVAL;
	}
	if (rc) {
		args_release(&a);
		return cli_usage_error("plan", "%s", err);
	}
	rc = plan(&pa, &a);
	args_release(&a);
	return rc;
}
