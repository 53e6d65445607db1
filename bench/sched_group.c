/* Interleaved 1F1B's group of microbatches a chunk (pipeline_interleave_group,
 * docs/pipeline.md) in the simulator alone: for S stages, M microbatches,
 * v = 2 chunks a stage and each group g from S to M that the builder
 * takes, the table simulated (host/pipeline/sim.c) at F, I, W ms a chunk's
 * action (B = I + W, recompute off, the owners' actions free) and every
 * transfer taking H ms (bench/sched_hop.c's model, the sender kept SEND
 * ms of it). Prints, a line a (S, M, g, H): the worst stage's idle (the
 * longest stage span minus a stage's compute) over the formula's
 * (S-1)(F+B), and the most chunk inputs a stage holds for a backward
 * (stage 0's, the peak) against 2(S-1) + (v-1)g + 1.
 * Built against build/libmeshrun.a (bench/sched_group.sh builds and runs
 * it):
 *   cc -std=c11 -D_GNU_SOURCE -O2 -I. -Ibuild bench/sched_group.c build/libmeshrun.a $(LIBS)
 * usage: sched_group S M F I W SEND H [H ...]
 *        sched_group grid S M G SLOTS: the first SLOTS unit slots of each
 *        stage at F 1, B 2, no hop (a forward's cell m.c: microbatch m
 *        through the stage's chunk c; a backward's two cells b) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host/pipeline/schedule.h"

static int grid(int S, int M, int g, int slots)
{
	char err[1024];
	struct pipe_shape p = { .sched = PIPE_INTERLEAVED, .stages = S, .microbatches = M, .repeats = 2,
				.group = g, .layers_per_stage = 1, .delay = 1, .wmode = PIPE_W_ITER,
				.recompute = false };
	struct pipe_table t;
	if (pipe_table_build(&t, &p, err, sizeof(err))) {
		fprintf(stderr, "sched_group: %s\n", err);
		return 1;
	}
	for (int s = 0; s < S; s++) {
		printf("stage %d", s);
		for (int u = 0; u < slots; u++) {
			const char *cell = ".";
			char buf[16];
			for (int k = 0; k < t.n[s]; k++) {
				const struct pipe_action *a = &t.a[s][k];
				if ((a->op != PA_F && a->op != PA_B) || a->t0 > u + 0.5 || a->t1 < u + 0.5)
					continue;
				snprintf(buf, sizeof(buf), "%d.%d", a->mb, a->chunk / S);
				cell = a->op == PA_F ? buf : "b";
			}
			printf(" %4s", cell);
		}
		printf("\n");
	}
	pipe_table_free(&t);
	return 0;
}

int main(int argc, char **argv)
{
	char err[1024];
	if (argc == 6 && !strcmp(argv[1], "grid"))
		return grid(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]));
	if (argc < 8) {
		fprintf(stderr, "usage: sched_group S M F I W SEND H [H ...]\n");
		return 2;
	}
	int S = atoi(argv[1]), M = atoi(argv[2]), v = 2;
	double f = atof(argv[3]), i = atof(argv[4]), w = atof(argv[5]), snd = atof(argv[6]);
	double fidle = (S - 1) * (f + i + w);
	printf("| S | M | g | hop ms | span ms | busy ms | idle ms | formula idle ms | idle / formula | "
	       "peak (stage 0) | formula peak |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
	for (int g = S; g <= M; g++) {
		struct pipe_shape p = { .sched = PIPE_INTERLEAVED, .stages = S, .microbatches = M, .repeats = v,
					.group = g == S ? 0 : g, .layers_per_stage = 1, .delay = 1,
					.wmode = PIPE_W_ITER, .recompute = false };
		struct pipe_table t;
		if (pipe_table_build(&t, &p, err, sizeof(err))) {
			printf("| %d | %d | %d | - | refused: %s |\n", S, M, g, err);
			continue;
		}
		struct pipe_stats st0;
		pipe_stage_stats(&t, 0, &st0);
		int peak = st0.peak_saved;
		for (int k = 7; k < argc; k++) {
			struct pipe_costs c = { .f = f, .i = i, .w = w, .b = i + w, .hop = atof(argv[k]),
						.send = snd };
			if (pipe_table_simulate(&t, &c, false, err, sizeof(err))) {
				fprintf(stderr, "sched_group: %s\n", err);
				return 1;
			}
			double busy = 0;
			for (int s = 0; s < S; s++) {
				struct pipe_stats st;
				pipe_stage_stats(&t, s, &st);
				busy = st.busy > busy ? st.busy : busy;
			}
			double idle = t.period - busy;
			printf("| %d | %d | %d | %.2f | %.1f | %.1f | %.1f | %.1f | %.3f | %d | %d |\n", S, M, g, c.hop,
			       t.period, busy, idle, fidle, idle / fidle, peak, pipe_peak_formula(&p, 0));
		}
		pipe_table_free(&t);
	}
	return 0;
}
