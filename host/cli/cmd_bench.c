/* `meshrun bench WHAT`: matmul peak, the records' cipher, raw TLS link
 * throughput, collectives, loading a checkpoint, a layer's split backward.
 * Benchmarks print figures; they never pass or fail on speed. link and
 * collectives start their own agents on loopback, which run this command
 * again with --agent. */
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>

#include "host/agent/agent.h"
#include "host/bench/bench_backward.h"
#include "host/bench/bench_cipher.h"
#include "host/bench/bench_coll.h"
#include "host/bench/bench_link.h"
#include "host/bench/bench_load.h"
#include "host/bench/bench_matmul.h"
#include "host/cli/cli.h"
#include "host/cli/cmds.h"
#include "host/config/config.h"
#include "host/launch/local.h"

#define END_FLAGS { NULL, 0, NULL, 0, 0, NULL }

/* Parses flags only (no key=value): 0, or the usage error's exit code
 * for `meshrun WHO`. */
static int flags_only(const char *who, const struct arg_flag *flags, int argc, char **argv)
{
	struct args a;
	char err[256];
	const struct arg_flag *const tables[] = { flags, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (!rc && a.noverrides) {
		snprintf(err, sizeof(err), "unexpected argument '%s'", a.overrides[0]);
		rc = -EINVAL;
	}
	args_release(&a);
	return rc ? cli_usage_error(who, "%s", err) : 0;
}

static int cmd_bench_matmul(int argc, char **argv)
{
	int threads = 0, size = 2048, reps = 5;
	const struct arg_flag flags[] = {
		{ "--threads", ARG_INT, &threads, 1, 1024, NULL },
		{ "--size", ARG_INT, &size, 1, 16384, NULL },
		{ "--reps", ARG_INT, &reps, 1, 1000, NULL },
		END_FLAGS,
	};
	int rc = flags_only("bench matmul", flags, argc, argv);
	return rc ? rc : cli_exit_code(bench_matmul_run(threads, size, reps));
}

static int cmd_bench_cipher(int argc, char **argv)
{
	int bytes = 16384, ms = 300;
	const struct arg_flag flags[] = {
		{ "--bytes", ARG_INT, &bytes, 1, 1 << 24, NULL },
		{ "--ms", ARG_INT, &ms, 1, 60000, NULL },
		END_FLAGS,
	};
	int rc = flags_only("bench cipher", flags, argc, argv);
	return rc ? rc : cli_exit_code(bench_cipher_run((size_t)bytes, ms / 1000.0));
}

/* A comma-separated list of byte counts, each in [lo, hi]. */
static int parse_list(const char *s, size_t *out, int *n, size_t lo, size_t hi)
{
	char buf[512];
	snprintf(buf, sizeof(buf), "%s", s);
	*n = 0;
	for (char *save = NULL, *t = strtok_r(buf, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
		if (*n == BENCH_MAX_LIST || cfg_parse_bytes(t, &out[*n]) || out[*n] < lo || out[*n] > hi)
			return -EINVAL;
		(*n)++;
	}
	return *n ? 0 : -EINVAL;
}

/* The agent half of link and collectives: this host's agent runs job. */
static int bench_agent(const char *who, const struct args *a, const struct mesh_args *m,
		       int want_hosts, agent_job_fn job, void *arg)
{
	static struct cfg cfg;
	char err[640];
	int host_id = -1;
	int rc = cli_agent_cfg(a, m, &cfg, &host_id, err, sizeof(err));
	if (rc) {
		cli_error(who, "%s", err);
		return rc;
	}
	if (want_hosts && cfg.num_hosts != want_hosts)
		return cli_usage_error(who, "needs exactly %d hosts, the mesh has %d", want_hosts,
				       cfg.num_hosts);
	rc = agent_run(&cfg, host_id, NULL, job, arg, err, sizeof(err));
	if (rc)
		cli_error(who, "host %d: %s", host_id, err);
	return cli_exit_code(rc);
}

/* The launcher half: a bad config is said once, here, not by every agent
 * it would start; 0 or the exit code (printed). */
static int bench_check_config(const char *who, const struct args *a, struct mesh_args *m)
{
	static struct cfg cfg;
	char err[640];
	int rc = cli_agent_check(a, m, NULL, &cfg, err, sizeof(err));
	if (rc)
		cli_error(who, "%s", err);
	else
		local_set_cpu_bind(cfg.cpu_bind, cfg.devices_per_host);
	return rc;
}

static const struct arg_flag launcher_only[] = {
	{ "--hosts", ARG_INT, NULL, 0, 0, NULL },
	END_FLAGS,
};

static int cmd_bench_link(int argc, char **argv)
{
	static struct link_opts o;
	const char *sizes = NULL;
	bool agent = false;
	struct mesh_args m = { .host_id = -1 };
	struct arg_flag mesh[MESH_FLAGS];
	struct args a;
	char err[640];
	const struct arg_flag flags[] = {
		{ "--agent", ARG_BOOL, &agent, 0, 0, NULL },
		{ "--oneway", ARG_BOOL, &o.oneway, 0, 0, NULL },
		{ "--pingpong", ARG_BOOL, &o.pingpong, 0, 0, NULL },
		{ "--sizes", ARG_STR, &sizes, 0, 0, NULL },
		{ "--iters", ARG_INT, &o.iters, 1, 10000000, NULL },
		END_FLAGS,
	};
	memset(&o, 0, sizeof(o));
	cli_mesh_flags(mesh, &m);
	const struct arg_flag *const tables[] = { flags, mesh, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (rc) {
		rc = cli_usage_error("bench link", "%s", err);
	} else if (!sizes) {
		rc = cli_usage_error("bench link", "--sizes is needed");
	} else if (parse_list(sizes, o.sizes, &o.nsizes, 1, 1ull << 32)) {
		rc = cli_usage_error("bench link", "bad size list '%s'", sizes);
	} else if (agent) {
		rc = bench_agent("bench link", &a, &m, 2, bench_link_job, &o);
	} else if (m.hosts != 2) {
		rc = cli_usage_error("bench link", "give --hosts 2");
	} else if ((rc = bench_check_config("bench link", &a, &m))) {
		/* printed */
	} else {
		static const char *const prefix[] = { "bench", "link", "--agent" };
		rc = cli_launch_local("bench link", 2, &a, argv, launcher_only, prefix, 3);
	}
	args_release(&a);
	return rc;
}

/* The collectives' own flags, checked; 0 or EXIT_USAGE (printed). */
static int coll_check_opts(struct bench_opts *o, const char *op, const char *sizes,
			   const char *counts)
{
	o->all_ops = op && !strcmp(op, "all");
	for (int k = 0; op && k < B_NOPS; k++)
		if (!strcmp(op, bench_coll_op_names[k]))
			o->op = k;
	static const char who[] = "bench collectives";
	if (op && !o->all_ops && o->op < 0)
		return cli_usage_error(who, "unknown op '%s' (all_gather, reduce_scatter, all_reduce, "
				       "all_to_all, permute, broadcast, all)", op);
	if (sizes && parse_list(sizes, o->sizes, &o->nsizes, 0, SIZE_MAX))
		return cli_usage_error(who, "bad size list '%s'", sizes);
	if (counts && parse_list(counts, o->counts, &o->ncounts, 0, SIZE_MAX))
		return cli_usage_error(who, "bad count list '%s'", counts);
	if (!o->ncounts && !o->nsizes)
		return cli_usage_error(who, "give --sizes (with --op) or --check-counts");
	if (!o->ncounts && o->op < 0 && !o->all_ops)
		return cli_usage_error(who, "give --op (all_gather, reduce_scatter, all_reduce, "
				       "all_to_all, permute, broadcast, all)");
	return 0;
}

static int cmd_bench_coll(int argc, char **argv)
{
	static struct bench_opts o;
	const char *op = NULL, *sizes = NULL, *counts = NULL;
	bool agent = false;
	struct mesh_args m = { .host_id = -1 };
	struct arg_flag mesh[MESH_FLAGS];
	struct args a;
	char err[640];
	o = (struct bench_opts){ .op = -1, .iters = 20, .warmup = 5, .direct_max = -1 };
	const struct arg_flag flags[] = {
		{ "--agent", ARG_BOOL, &agent, 0, 0, NULL },
		{ "--corrupt-for-test", ARG_BOOL, &o.corrupt, 0, 0, NULL },
		{ "--barrier", ARG_BOOL, &o.barrier, 0, 0, NULL },
		{ "--async", ARG_BOOL, &o.async, 0, 0, NULL },
		{ "--op", ARG_STR, &op, 0, 0, NULL },
		{ "--sizes", ARG_STR, &sizes, 0, 0, NULL },
		{ "--check-counts", ARG_STR, &counts, 0, 0, NULL },
		{ "--check-lists", ARG_BOOL, &o.lists_only, 0, 0, NULL },
		{ "--check-bits", ARG_BOOL, &o.check_bits, 0, 0, NULL },
		{ "--iters", ARG_INT, &o.iters, 1, 1000000000, NULL },
		{ "--warmup", ARG_INT, &o.warmup, 0, 1000000000, NULL },
		{ "--direct-max", ARG_LONG, &o.direct_max, 0, 1000000000, NULL },
		END_FLAGS,
	};
	cli_mesh_flags(mesh, &m);
	const struct arg_flag *const tables[] = { flags, mesh, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (rc) {
		rc = cli_usage_error("bench collectives", "%s", err);
	} else if ((rc = coll_check_opts(&o, op, sizes, counts))) {
		/* printed */
	} else if (agent) {
		rc = bench_agent("bench collectives", &a, &m, 0, bench_coll_job, &o);
	} else if (m.hosts < 1) {
		rc = cli_usage_error("bench collectives", "give --hosts N");
	} else if ((rc = bench_check_config("bench collectives", &a, &m))) {
		/* printed */
	} else {
		static const char *const prefix[] = { "bench", "collectives", "--agent" };
		rc = cli_launch_local("bench collectives", m.hosts, &a, argv, launcher_only, prefix, 3);
	}
	args_release(&a);
	return rc;
}

/* One host's share of loading load_parameters_path (bench/load.sh runs
 * one per host at once). */
static int cmd_bench_load(int argc, char **argv)
{
	static struct cfg cfg;
	struct mesh_args m = { .host_id = -1 };
	struct arg_flag mesh[MESH_FLAGS];
	struct args a;
	char err[640];
	int host_id = 0;
	cli_mesh_flags(mesh, &m);
	const struct arg_flag *const tables[] = { mesh, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (rc) {
		args_release(&a);
		return cli_usage_error("bench load", "%s", err);
	}
	rc = cli_agent_cfg(&a, &m, &cfg, &host_id, err, sizeof(err));
	args_release(&a);
	if (!rc && !cfg.load_parameters_path[0])
		return cli_usage_error("bench load", "needs load_parameters_path=DIR");
	if (rc) {
		cli_error("bench load", "%s", err);
		return rc;
	}
	return cli_exit_code(bench_load_run(&cfg, host_id));
}

/* One layer's F, B, I and W on one device (the split backward's costs). */
static int cmd_bench_backward(int argc, char **argv)
{
	static struct cfg cfg;
	int rounds = 9, rows = 0;
	struct args a;
	char err[640];
	const struct arg_flag flags[] = {
		{ "--config", ARG_CONFIG, NULL, 0, 0, NULL },
		{ "--rounds", ARG_INT, &rounds, 1, 64, NULL },
		{ "--rows", ARG_INT, &rows, 1, 1 << 20, NULL },
		END_FLAGS,
	};
	const struct arg_flag *const tables[] = { flags, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (rc) {
		args_release(&a);
		return cli_usage_error("bench backward", "%s", err);
	}
	rc = args_load_cfg(&a, &cfg, err, sizeof(err));
	args_release(&a);
	if (!rc && cfg_finish(&cfg, 1, 1, err, sizeof(err)))
		rc = -EINVAL;
	if (rc) {
		cli_error("bench backward", "%s", err);
		return cli_exit_code(rc);
	}
	return cli_exit_code(bench_backward_run(&cfg, rows ? rows : (int)cfg.per_device_batch_size, rounds));
}

int cmd_bench(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "backward"))
		return cmd_bench_backward(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "load"))
		return cmd_bench_load(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "matmul"))
		return cmd_bench_matmul(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "cipher"))
		return cmd_bench_cipher(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "link"))
		return cmd_bench_link(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "collectives"))
		return cmd_bench_coll(argc - 1, argv + 1);
	return cli_usage_error("bench", "give matmul, cipher, link, collectives, load or backward");
}
