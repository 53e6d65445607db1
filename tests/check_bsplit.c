/* DeepSeek's batch split (batch_split_factor, use_batch_split_schedule,
 * docs/deepseek.md#batch-split) on deepseek3-tiny, with real agents on
 * loopback:
 *
 * - the keys: a dense model, a factor other than 1 or 2, a factor that
 *   does not divide per_device_batch_size, a pipeline and a zero-bubble
 *   schedule are refused naming their keys (the factor alone as the
 *   schedule); factor 1 is the unsplit schedule, bit for bit;
 * - the same bits: 10 training steps with factor 2, the schedule on
 *   (staggered) against off (one half after the other), every step's
 *   loss_hex and gradient norm identical, on one device, EP=2, EP=4,
 *   FSDP2 x EP2, FSDP2 x TP2 and EP2 x TPT2, and deepseek-tiny (the
 *   grouped-query MoE model) on EP=2 and EP=4. The halves fix the math
 *   (which rows each product has, the order the halves' weight gradients
 *   are added in), the schedule only when the pieces run; from the
 *   traces, off runs the halves' pieces with no exchange in the
 *   background and gathers the expert counts as often as on;
 * - the same math: factor 1 (unsplit) within 1e-4 of factor 2 (its
 *   products on other rows round apart: OpenBLAS rounds a row by where
 *   it sits in its product, and a weight gradient is two products
 *   summed), and at EP=4 the split run and factor 1 within 1e-4 of one
 *   device, as every other mesh is compared; and the expert counts the
 *   selection bias's update reads (MESHRUN_EXPERT_LOAD) are the whole
 *   global batch's, both halves and every device summed, as one
 *   device's;
 * - the overlap, from the trace (not from timings): at EP=4 each half's
 *   expert all-to-all is in flight on the communication thread while the
 *   other half computes, forward and backward, on every device; and the
 *   staggering crosses the executor's one-layer calls (the second half's
 *   combine finished after the next layer's first-half attention). */
#include <cJSON.h>
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/equiv.h"

#define DS3 "configs/deepseek3-tiny.yml"
#define SPLIT "use_batch_split_schedule=true batch_split_factor=2"

static void setup(void)
{
	proc_setup("meshrun-bsplit", 0);
}

/* ---- the keys ---- */

/* meshrun `args` exits with `code` and says `what` */
static void refused(const char *args, int code, const char *what)
{
	struct proc p;
	int rc = proc_run(&p, "refused", args, 60);
	char *out = read_tmp("refused.out");
	ck_assert_msg(rc == code && strstr(out, what), "%s: exit %d, want %d and '%s': %s", args, rc, code,
		      what, out);
	free(out);
}

START_TEST(test_keys)
{
	refused("train --config configs/llama-tiny.yml steps=1 " SPLIT, 3,
		"keys 'use_batch_split_schedule' and 'num_experts' (1)");
	refused("train --config " DS3 " steps=1 use_batch_split_schedule=true batch_split_factor=4", 3,
		"key 'batch_split_factor' must be 1 or 2");
	/* the factor alone cuts the halves: refused as the schedule is */
	refused("train --config configs/llama-tiny.yml steps=1 batch_split_factor=2", 3,
		"keys 'batch_split_factor' and 'num_experts' (1)");
	refused("local --hosts 1 --devices-per-host 2 --config " DS3 " steps=1 ici_data_parallelism=1 "
		"ici_pipeline_parallelism=2 per_device_batch_size=4 num_pipeline_microbatches=2 "
		"batch_split_factor=2", 3, "key 'batch_split_factor' does not run beside pipeline parallelism");
	refused("train --config " DS3 " steps=1 per_device_batch_size=3 " SPLIT, 3,
		"key 'batch_split_factor' (2) must divide 'per_device_batch_size' (3)");
	refused("train --config " DS3 " steps=1 batch_split_factor=0", 3, "key 'batch_split_factor' must be >= 1");
	refused("local --hosts 1 --devices-per-host 2 --config " DS3 " steps=1 ici_data_parallelism=1 "
		"ici_pipeline_parallelism=2 per_device_batch_size=4 num_pipeline_microbatches=2 " SPLIT, 3,
		"key 'use_batch_split_schedule' does not run beside pipeline parallelism");
	refused("local --hosts 1 --devices-per-host 2 --config " DS3 " steps=1 ici_data_parallelism=1 "
		"ici_pipeline_parallelism=2 per_device_batch_size=4 num_pipeline_microbatches=2 "
		"pipeline_schedule=zbv " SPLIT, 3, "keys 'use_batch_split_schedule' and 'pipeline_schedule' (zbv)");
}
END_TEST

/* factor 1: one part, today's order (MaxText's default factor) */
START_TEST(test_factor_one)
{
	double a[10], b[10];
	char args[512];
	snprintf(args, sizeof(args), "train --config " DS3 " steps=10 --metrics %s/f0.jsonl", tmpdir);
	show_log_on_failure(run(args), 0);
	snprintf(args, sizeof(args), "train --config " DS3 " steps=10 use_batch_split_schedule=true "
		 "batch_split_factor=1 --metrics %s/f1.jsonl", tmpdir);
	show_log_on_failure(run(args), 0);
	ck_assert_int_eq(losses("f0.jsonl", a, 10), 10);
	ck_assert_int_eq(losses("f1.jsonl", b, 10), 10);
	for (int s = 0; s < 10; s++)
		ck_assert_msg(a[s] == b[s], "step %d: %a vs %a", s, a[s], b[s]);
}
END_TEST

/* ---- reading the trace ---- */

struct span {
	double a, b;
	int half, layer;
	bool bwd;
};

#define MAX_SPANS 4096

struct dev_trace {
	struct span flight[MAX_SPANS], compute[MAX_SPANS], wait[MAX_SPANS];
	int nf, nc, nw;
	/* the compute spans' names and steps, beside compute[] */
	char cname[MAX_SPANS][24];
	int cstep[MAX_SPANS];
	/* the expert counts' all_gathers ("all_gather expert") of steps 1..7 */
	int gathers[8];
};

/* "disp h0 L3", "comb bwd h1 L4", "experts bwd h0 L3": the half, the
 * layer, and whether it is a backward piece; false for other names */
static bool parse_half(const char *name, struct span *s)
{
	const char *h = strstr(name, " h");
	if (!h || (h[2] != '0' && h[2] != '1') || strncmp(h + 3, " L", 2))
		return false;
	s->half = h[2] - '0';
	s->layer = atoi(h + 5);
	s->bwd = strstr(name, "bwd") != NULL;
	return true;
}

static void add(struct span *v, int *n, const struct span *s)
{
	ck_assert_int_lt(*n, MAX_SPANS);
	v[(*n)++] = *s;
}

/* The whole of file path, malloc'd. */
static char *read_all(const char *path)
{
	FILE *f = fopen(path, "rb");
	ck_assert_msg(f, "no trace at %s", path);
	ck_assert_int_eq(fseek(f, 0, SEEK_END), 0);
	long n = ftell(f);
	rewind(f);
	char *text = malloc((size_t)n + 1);
	ck_assert(text && fread(text, 1, (size_t)n, f) == (size_t)n);
	text[n] = 0;
	fclose(f);
	return text;
}

/* Device dev's spans of the steps >= 1 of trace file path. */
static void read_trace(const char *path, int dev, struct dev_trace *t)
{
	char *text = read_all(path);
	cJSON *root = cJSON_Parse(text);
	free(text);
	ck_assert_msg(root, "trace %s is not JSON", path);
	const cJSON *e;
	memset(t, 0, sizeof(*t));
	cJSON_ArrayForEach(e, cJSON_GetObjectItem(root, "traceEvents")) {
		const cJSON *ph = cJSON_GetObjectItem(e, "ph"), *name = cJSON_GetObjectItem(e, "name");
		const cJSON *cat = cJSON_GetObjectItem(e, "cat"), *args = cJSON_GetObjectItem(e, "args");
		if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") || !cJSON_IsString(name) ||
		    !cJSON_IsString(cat) || cJSON_GetObjectItem(args, "step")->valuedouble < 1)
			continue;
		int tid = cJSON_GetObjectItem(e, "tid")->valueint;
		double ts = cJSON_GetObjectItem(e, "ts")->valuedouble, dur = cJSON_GetObjectItem(e, "dur")->valuedouble;
		struct span s = { .a = ts, .b = ts + dur };
		const char *c = cat->valuestring, *n = name->valuestring;
		if (tid == 2000 + dev && !strcmp(c, "flight") && parse_half(n, &s))
			add(t->flight, &t->nf, &s);
		else if (tid == dev && !strcmp(c, "compute") && parse_half(n, &s)) {
			snprintf(t->cname[t->nc], sizeof(t->cname[0]), "%s", n);
			t->cstep[t->nc] = cJSON_GetObjectItem(args, "step")->valueint;
			add(t->compute, &t->nc, &s);
		}
		else if (tid == dev && !strcmp(c, "comm")) {
			int step = cJSON_GetObjectItem(args, "step")->valueint;
			if (!strncmp(n, "all_gather expert", 17) && step < 8)
				t->gathers[step]++;
			add(t->wait, &t->nw, &s);
		}
	}
	cJSON_Delete(root);
}

/* Time of [a, b) that the device spends outside every wait span (the
 * waits on its own thread do not nest in each other). */
static double not_waiting(const struct dev_trace *t, double a, double b)
{
	double len = b > a ? b - a : 0;
	for (int i = 0; i < t->nw && len > 0; i++) {
		double x = fmax(a, t->wait[i].a), y = fmin(b, t->wait[i].b);
		if (y > x)
			len -= y - x;
	}
	return len > 0 ? len : 0;
}

/* Microseconds that half h's exchanges (backward ones or forward ones)
 * are in flight while the other half computes on the device's thread
 * (in one of its pieces, not waiting inside it); *total: their flight. */
static double overlap(const struct dev_trace *t, int h, bool bwd, double *total)
{
	double both = 0;
	*total = 0;
	for (int i = 0; i < t->nf; i++) {
		const struct span *f = &t->flight[i];
		if (f->half != h || f->bwd != bwd)
			continue;
		*total += f->b - f->a;
		for (int j = 0; j < t->nc; j++) {
			const struct span *c = &t->compute[j];
			if (c->half == 1 - h)
				both += not_waiting(t, fmax(f->a, c->a), fmin(f->b, c->b));
		}
	}
	return both;
}

/* The compute span "what hH LL" of step s (that it exists is asserted). */
static const struct span *piece_span(const struct dev_trace *t, int s, const char *what, int h, int l)
{
	char name[24];
	snprintf(name, sizeof(name), "%s h%d L%d", what, h, l);
	for (int i = 0; i < t->nc; i++)
		if (t->cstep[i] == s && !strcmp(t->cname[i], name))
			return &t->compute[i];
	ck_abort_msg("step %d: no span '%s'", s, name);
	return NULL;
}

/* The staggering crosses the executor's calls (one layer each): the
 * second half's combine of MoE layer l is finished only after the first
 * half's attention of layer l+1, and in the backward its combine
 * backward of layer l-1 is sent before the first half's route backward
 * of layer l (deepseek3-tiny: MoE layers 2..5). */
static void check_order(const struct dev_trace *t, int dev)
{
	for (int s = 1; s <= 3; s++)
		for (int l = 2; l < 5; l++) {
			const struct span *fin = piece_span(t, s, "finish", 1, l);
			const struct span *att = piece_span(t, s, "attn", 0, l + 1);
			ck_assert_msg(fin->a >= att->b, "device %d step %d: half 1's finish of layer %d before half "
				      "0's attention of layer %d", dev, s, l, l + 1);
			const struct span *fb = piece_span(t, s, "finish bwd", 1, l);
			const struct span *rb = piece_span(t, s, "route bwd", 0, l + 1);
			ck_assert_msg(fb->b <= rb->a, "device %d step %d: half 1's combine backward of layer %d "
				      "after half 0's route backward of layer %d", dev, s, l, l + 1);
		}
}

/* ---- same math ---- */

/* The grad_norm of every line of tmpdir/name (10 at most). */
static int grad_norms(const char *name, double *out)
{
	char path[256], line[4096];
	snprintf(path, sizeof(path), "%s/%s", tmpdir, name);
	FILE *f = fopen(path, "r");
	int n = 0;
	while (f && n < 10 && fgets(line, sizeof(line), f)) {
		char *p = strstr(line, "\"grad_norm\":");
		ck_assert_msg(p, "metrics line without grad_norm: %s", line);
		out[n++] = strtod(p + 12, NULL);
	}
	if (f)
		fclose(f);
	return n;
}

/* meshrun on hosts x dph devices (1 x 1: train) of config cfg with keys,
 * 10 training steps, into tmpdir/name.jsonl; the losses (exact, from
 * loss_hex) in out, the gradient norms in gn */
static void run_losses(const char *cfg, int hosts, int dph, const char *keys, const char *name, double *out,
		       double *gn)
{
	char args[1024];
	if (hosts * dph == 1)
		snprintf(args, sizeof(args), "train --config %s steps=10 %s --metrics %s/%s.jsonl", cfg, keys,
			 tmpdir, name);
	else
		snprintf(args, sizeof(args), "local --hosts %d --devices-per-host %d --config %s steps=10 "
			 "%s --metrics %s/%s.jsonl", hosts, dph, cfg, keys, tmpdir, name);
	show_log_on_failure(run(args), 0);
	char file[64];
	snprintf(file, sizeof(file), "%s.jsonl", name);
	ck_assert_int_eq(losses(file, out, 10), 10);
	ck_assert_int_eq(grad_norms(file, gn), 10);
}

/* The worst relative difference of a[0..10) to b[0..10), each within
 * REL_TOL (what: the two runs, for the message). */
static double within(const double *a, const double *b, const char *what)
{
	double worst = 0;
	for (int s = 0; s < 10; s++) {
		double rel = fabs(a[s] - b[s]) / fabs(b[s]);
		worst = rel > worst ? rel : worst;
		ck_assert_msg(rel < REL_TOL, "%s step %d: loss %.9g against %.9g (%.2e)", what, s, a[s], b[s], rel);
	}
	return worst;
}

/* The expert counts a run wrote to tmpdir/name.load (MESHRUN_EXPERT_LOAD:
 * a line "L<l> c0 .. c15" a MoE layer and step) into c; the lines read. */
static int read_loads(const char *name, int c[][16], int max)
{
	char path[256], line[512];
	snprintf(path, sizeof(path), "%s/%s.load", tmpdir, name);
	FILE *f = fopen(path, "r");
	ck_assert_msg(f, "no expert counts in '%s'", path);
	int n = 0;
	while (n < max && fgets(line, sizeof(line), f)) {
		char *p = strchr(line, ' ');
		for (int e = 0; e < 16; e++)
			c[n][e] = p ? (int)strtol(p, &p, 10) : -1;
		n++;
	}
	fclose(f);
	return n;
}

/* Runs what follows with MESHRUN_EXPERT_LOAD=tmpdir/name.load (NULL: off) */
static void expert_load_to(const char *name)
{
	char path[256];
	snprintf(path, sizeof(path), "%s/%s.load", tmpdir, name ? name : "");
	if (name) {
		remove(path);
		setenv("MESHRUN_EXPERT_LOAD", path, 1);
	} else {
		unsetenv("MESHRUN_EXPERT_LOAD");
	}
}

/* deepseek3-tiny's 4 MoE layers, 10 steps: each layer's counts of each
 * step sum to the global batch's 8 x 64 tokens x top 4 (every device and
 * both halves counted once), and at step 0 (the same weights) run a
 * routes as one device does but for near ties. */
static void loads_global(const char *a, const char *what)
{
	static int ca[40][16], c1[40][16];
	ck_assert_int_eq(read_loads(a, ca, 40), 40);
	ck_assert_int_eq(read_loads("one", c1, 40), 40);
	int diff = 0;
	for (int i = 0; i < 40; i++) {
		int sa = 0, s1 = 0;
		for (int e = 0; e < 16; e++) {
			sa += ca[i][e];
			s1 += c1[i][e];
			diff += i < 4 ? abs(ca[i][e] - c1[i][e]) : 0;
		}
		ck_assert_msg(sa == 8 * 64 * 4 && s1 == sa, "%s: step %d layer line %d: %d expert rows counted, one "
			      "device %d, want %d", what, i / 4, i % 4, sa, s1, 8 * 64 * 4);
	}
	ck_assert_msg(diff <= 16, "%s: step 0 expert counts %d rows apart from one device's", what, diff);
	fprintf(stderr, "; %s: step-0 expert counts %d rows apart", what, diff);
}

/* What a case compares beside the schedule on and off. */
enum { VS_FACTOR1 = 1, VS_ONE_DEVICE = 2 };

/* Training (the selection bias moving), global batch 8, factor 2: the
 * staggered schedule against the unstaggered one on the same mesh, every
 * step's loss_hex and gradient norm identical. The halves fix the
 * products and the order their weight gradients are summed in, the
 * schedule only when the pieces run (docs/deepseek.md#batch-split), so
 * no tolerance: one last bit anywhere would move a token to another
 * expert within the 10 steps. Two schedules giving the same bits also
 * show the runs deterministic. With VS_FACTOR1 the unsplit run
 * (factor 1) is within REL_TOL of the unstaggered one (the same math, the
 * halves' products rounded apart); with VS_ONE_DEVICE the split run and
 * the unsplit one are each within REL_TOL of one device. */
static void split_cases(const char *cfg, int hosts, int dph, const char *mesh, int vs)
{
	char keys[768], what[256];
	double off[10], on[10], f1[10], goff[10], gon[10], gf1[10], one[10];
	int pdb = 8 / (hosts * dph);
	snprintf(what, sizeof(what), "%s %dx%d %s", cfg, hosts, dph, mesh);
	/* on several devices both runs traced: path[k], and opt[k] the
	 * option that asks for it */
	bool traced = hosts * dph > 1;
	char path[2][256], opt[2][300] = { "", "" };
	for (int k = 0; k < 2 && traced; k++) {
		snprintf(path[k], sizeof(path[k]), "%s/%s.json", tmpdir, k ? "on" : "off");
		snprintf(opt[k], sizeof(opt[k]), " --trace %.255s", path[k]);
	}
	snprintf(keys, sizeof(keys), "per_device_batch_size=%d %s batch_split_factor=2%s", pdb, mesh, opt[0]);
	run_losses(cfg, hosts, dph, keys, "off", off, goff);
	snprintf(keys, sizeof(keys), "per_device_batch_size=%d %s " SPLIT "%s", pdb, mesh, opt[1]);
	expert_load_to(vs & VS_ONE_DEVICE ? "on" : NULL);
	run_losses(cfg, hosts, dph, keys, "on", on, gon);
	expert_load_to(NULL);
	for (int s = 0; s < 10; s++)
		ck_assert_msg(on[s] == off[s] && gon[s] == goff[s], "%s step %d: schedule on and off differ: loss "
			      "%a vs %a, gradient norm %a vs %a", what, s, on[s], off[s], gon[s], goff[s]);
	/* ten batches, not one, and training: the losses differ step to step */
	ck_assert(off[1] != off[0] && off[9] < off[0]);
	if (traced) {
		/* off is the halves' pieces one after the other: no exchange in
		 * the background, and the expert counts gathered as often as
		 * staggered (once a MoE layer for both halves, with experts) */
		static struct dev_trace t[2];
		for (int k = 0; k < 2; k++)
			read_trace(path[k], 0, &t[k]);
		ck_assert_msg(t[0].nf == 0 && t[0].nc > 0, "%s: schedule off ran %d exchanges in the background, "
			      "%d pieces of a half", what, t[0].nf, t[0].nc);
		for (int s = 1; s <= 3; s++)
			ck_assert_msg(t[0].gathers[s] == t[1].gathers[s], "%s step %d: %d all_gathers of expert "
				      "counts off, %d on", what, s, t[0].gathers[s], t[1].gathers[s]);
	}
	fprintf(stderr, "batch split %s: schedule on and off bit-identical, 10 steps", what);
	if (vs & VS_FACTOR1) {
		snprintf(keys, sizeof(keys), "per_device_batch_size=%d %s", pdb, mesh);
		expert_load_to(vs & VS_ONE_DEVICE ? "f1" : NULL);
		run_losses(cfg, hosts, dph, keys, "f1", f1, gf1);
		expert_load_to(NULL);
		double w = within(f1, off, "factor 1 against factor 2");
		bool same = true;
		for (int s = 0; s < 10; s++)
			same = same && f1[s] == off[s];
		/* the halves' products do round apart from the whole's: were
		 * they equal, the factor would cut nothing */
		ck_assert_msg(!same, "%s: factor 1 and factor 2 bit-identical", what);
		fprintf(stderr, "; factor 1 against 2: worst %.2e", w);
	}
	if (vs & VS_ONE_DEVICE) {
		expert_load_to("one");
		single_losses(cfg, "", 8, one);
		expert_load_to(NULL);
		fprintf(stderr, "; against one device: split %.2e", within(on, one, "split against one device"));
		if (vs & VS_FACTOR1)
			fprintf(stderr, ", factor 1 %.2e", within(f1, one, "factor 1 against one device"));
		loads_global("on", "split against one device");
		if (vs & VS_FACTOR1)
			loads_global("f1", "factor 1 against one device");
	}
	fprintf(stderr, "\n");
}

START_TEST(test_one_device) { split_cases(DS3, 1, 1, "", 0); }
END_TEST
#define EP2 "ici_data_parallelism=1 ici_expert_parallelism=2"
START_TEST(test_ep2) { split_cases(DS3, 1, 2, EP2, 0); }
END_TEST
#define EP4 "dcn_data_parallelism=1 ici_data_parallelism=1 dcn_expert_parallelism=2 ici_expert_parallelism=2"
START_TEST(test_ep4) { split_cases(DS3, 2, 2, EP4, VS_FACTOR1 | VS_ONE_DEVICE); }
END_TEST
/* FSDP over hosts with experts inside each: the weights come through the
 * window a layer ahead while the halves stagger */
START_TEST(test_fsdp2_ep2)
{
	split_cases(DS3, 2, 2, "dcn_data_parallelism=1 ici_data_parallelism=1 dcn_fsdp_parallelism=2 "
		    "ici_expert_parallelism=2", 0);
}
END_TEST
/* tensor parallelism: the halves' partial sums are all-reduced on the
 * device's thread while an exchange flies on its communication thread */
START_TEST(test_fsdp2_tp2)
{
	split_cases(DS3, 2, 2, "dcn_data_parallelism=1 ici_data_parallelism=1 dcn_fsdp_parallelism=2 "
		    "ici_tensor_parallelism=2", 0);
}
END_TEST
/* tensor_transpose: the embedding split, norm statistics and the
 * routing weights' gradients summed over it, experts across hosts */
START_TEST(test_ep2_tpt2)
{
	split_cases(DS3, 2, 2, "dcn_data_parallelism=1 ici_data_parallelism=1 dcn_expert_parallelism=2 "
		    "ici_tensor_transpose_parallelism=2", 0);
}
END_TEST
/* the other MoE model the suites train: grouped-query attention, a
 * softmax router without groups, 8 experts */
#define DS "configs/deepseek-tiny.yml"
START_TEST(test_ds_ep2) { split_cases(DS, 1, 2, EP2, VS_FACTOR1); }
END_TEST
START_TEST(test_ds_ep4) { split_cases(DS, 2, 2, EP4, 0); }
END_TEST

/* ---- the overlap, from the trace ---- */

START_TEST(test_trace_overlap)
{
	char args[768], path[256];
	snprintf(path, sizeof(path), "%s/trace.json", tmpdir);
	snprintf(args, sizeof(args), "local --hosts 2 --devices-per-host 2 --config " DS3 " steps=4 "
		 "per_device_batch_size=2 " EP4 " " SPLIT " --trace %s", path);
	show_log_on_failure(run(args), 0);
	static struct dev_trace t;
	for (int dev = 0; dev < 4; dev++) {
		read_trace(path, dev, &t);
		/* every exchange of steps 1..3: 4 MoE layers x 2 halves x
		 * (dispatch, combine) x (forward, backward) */
		ck_assert_msg(t.nf == 3 * 4 * 2 * 2 * 2, "device %d: %d exchanges in flight, want %d", dev, t.nf,
			      3 * 4 * 2 * 2 * 2);
		check_order(&t, dev);
		/* one counts' all_gather a MoE layer for both halves, as the
		 * unsplit run, and the step's expert-count sum */
		for (int s = 1; s <= 3; s++)
			ck_assert_msg(t.gathers[s] == 4 + 1, "device %d step %d: %d all_gathers of expert counts, "
				      "want %d", dev, s, t.gathers[s], 4 + 1);
		for (int h = 0; h < 2; h++)
			for (int bwd = 0; bwd < 2; bwd++) {
				double total, both = overlap(&t, h, bwd, &total);
				fprintf(stderr, "device %d half %d %s: exchanges in flight %.0f us, %.0f us of it "
					"beside the other half's compute\n", dev, h, bwd ? "backward" : "forward",
					total, both);
				ck_assert_msg(both > 0, "device %d: half %d's %s exchanges never fly while half %d "
					      "computes", dev, h, bwd ? "backward" : "forward", 1 - h);
			}
	}
}
END_TEST

int main(void)
{
	Suite *s = suite_create("bsplit");
	TCase *tk = tcase_create("keys");
	tcase_add_checked_fixture(tk, setup, teardown);
	tcase_set_timeout(tk, 120);
	tcase_add_test(tk, test_keys);
	tcase_add_test(tk, test_factor_one);
	suite_add_tcase(s, tk);
	TCase *te = tcase_create("equivalence");
	tcase_add_checked_fixture(te, setup, teardown);
	tcase_set_timeout(te, 400);
	tcase_add_test(te, test_one_device);
	tcase_add_test(te, test_ep2);
	tcase_add_test(te, test_ep4);
	tcase_add_test(te, test_fsdp2_ep2);
	tcase_add_test(te, test_fsdp2_tp2);
	tcase_add_test(te, test_ep2_tpt2);
	tcase_add_test(te, test_ds_ep2);
	tcase_add_test(te, test_ds_ep4);
	suite_add_tcase(s, te);
	TCase *tt = tcase_create("trace");
	tcase_add_checked_fixture(tt, setup, teardown);
	tcase_set_timeout(tt, 200);
	tcase_add_test(tt, test_trace_overlap);
	suite_add_tcase(s, tt);
	SRunner *sr = srunner_create(s);
	srunner_set_fork_status(sr, CK_NOFORK);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
