/* `meshrun train` and `meshrun eval`: one device. */
#include <errno.h>
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>

#include "host/cli/args.h"
#include "host/cli/cli.h"
#include "host/ckpt/ckpt.h"
#include "host/config/config.h"
#include "host/data/data.h"
#include "host/train/loop.h"
#include "host/train/train.h"
#include "host/util/threads.h"

static int train_run(const struct cfg *c, const struct train_opts *o, char *err, size_t errlen)
{
	struct trainer *t;
	struct steplog log;
	int64_t start = 0;
	int rc = trainer_open(&t, c, (int)c->per_device_batch_size, NULL, err, errlen);
	if (rc)
		return rc;
	if (o->resume && (rc = trainer_load(t, o->ckpt_dir, &start, err, errlen)))
		goto out;
	if ((rc = train_log_open(&log, o, t, 1, err, errlen)))
		goto out;
	struct train_loop loop = {
		.t = t, .opts = o, .global_rows = (int)c->per_device_batch_size, .leader = true,
		.log = &log,
	};
	rc = train_loop_run(&loop, start, err, errlen);
	steplog_close(&log);
out:
	trainer_free(t);
	return rc;
}

int cmd_train(int argc, char **argv)
{
	struct train_opts o = { 0 };
	static struct cfg c;
	struct args a;
	char err[1024];
	const struct arg_flag flags[] = {
		{ "--config", ARG_CONFIG, NULL, 0, 0, NULL },
		{ "--metrics", ARG_STR, &o.metrics, 0, 0, NULL },
		{ "--checkpoint-dir", ARG_STR, &o.ckpt_dir, 0, 0, NULL },
		{ "--trace", ARG_STR, &o.trace, 0, 0, NULL },
		{ "--resume", ARG_BOOL, &o.resume, 0, 0, NULL },
		{ "--quiet", ARG_BOOL, &o.quiet, 0, 0, NULL },
		{ NULL, 0, NULL, 0, 0, NULL },
	};
	const struct arg_flag *const tables[] = { flags, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (!rc && o.resume && !o.ckpt_dir) {
		snprintf(err, sizeof(err), "--resume needs --checkpoint-dir DIR");
		rc = -EINVAL;
	}
	if (rc) {
		fprintf(stderr, "meshrun: train: %s\n", err);
		args_release(&a);
		return EXIT_USAGE;
	}
	rc = args_load_cfg(&a, &c, err, sizeof(err));
	args_release(&a);
	if (!rc && !(rc = cfg_finish(&c, 1, 1, err, sizeof(err)) ? -EINVAL : 0)) {
		util_blas_threads(&c, 1);
		rc = train_run(&c, &o, err, sizeof(err));
	}
	if (rc)
		fprintf(stderr, "%s\n", err);
	return cli_exit_code(rc);
}

/* The config eval runs: the checkpoint's (dir: a run's checkpoint
 * directory, whose newest step it takes, or one step directory),
 * overridden, on one device. Its data is the held-out data the config
 * names (docs/data.md#evaluation); --text FILE is short for
 * eval_dataset_type=text eval_dataset_path=FILE eval_steps=-1. A
 * checkpoint without a readable meshrun.yml is bad input; a bad override
 * a config error. */
static int eval_cfg(struct cfg *c, const char *dir, const char *text, const struct args *a,
		    char *err, size_t errlen)
{
	char path[4200], step_dir[4096], why[1024];
	cfg_defaults(c);
	if (ckpt_find(dir, step_dir, sizeof(step_dir), NULL, why, sizeof(why))) {
		snprintf(err, errlen, "eval: %s", why);
		return -EBADMSG;
	}
	snprintf(path, sizeof(path), "%s/meshrun.yml", step_dir);
	if (cfg_load_file(c, path, why, sizeof(why))) {
		snprintf(err, errlen, "eval: %s", why);
		return -EBADMSG;
	}
	if (text) {
		snprintf(c->eval_dataset_type, sizeof(c->eval_dataset_type), "text");
		snprintf(c->eval_dataset_path, sizeof(c->eval_dataset_path), "%s", text);
		c->eval_steps = -1;
	}
	for (int i = 0; i < a->noverrides; i++)
		if (cfg_override(c, a->overrides[i], err, errlen))
			return -EINVAL;
	/* eval runs on one device whatever mesh trained the checkpoint */
	cfg_single_device(c);
	return cfg_finish(c, 1, 1, err, errlen) ? -EINVAL : 0;
}

static int eval_run(const struct cfg *c, const char *dir, char *err, size_t errlen)
{
	struct trainer *t;
	char why[1024];
	int B = (int)c->per_device_batch_size;
	double loss;
	int64_t tokens;
	int rc = trainer_open_eval(&t, c, B, NULL, why, sizeof(why));
	if (!rc && (rc = trainer_load(t, dir, NULL, why, sizeof(why))) == 0 &&
	    (rc = trainer_eval(t, B, 0, NULL, &loss, &tokens, why, sizeof(why))) == 0) {
		struct data_source *d = trainer_eval_data(t);
		int64_t nb = data_eval_batches(d, B, c->eval_steps, NULL, 0), rows = data_rows(d);
		if (rows < 0 || rows > nb * B)
			rows = nb * B;
		printf("eval_data: %s '%s'\neval_batches: %" PRId64 "\neval_rows: %" PRId64
		       "\neval_tokens: %" PRId64 "\neval_loss: %.6f\neval_loss_hex: %a\n",
		       data_type_name(d), c->eval_dataset_path[0] ? c->eval_dataset_path : c->dataset_path,
		       nb, rows, tokens, loss, loss);
	}
	if (rc)
		snprintf(err, errlen, "eval: %s", why);
	trainer_free(t);
	return rc;
}

int cmd_eval(int argc, char **argv)
{
	const char *dir = NULL, *text = NULL;
	static struct cfg c;
	struct args a;
	char err[1280];
	const struct arg_flag flags[] = {
		{ "--checkpoint", ARG_STR, &dir, 0, 0, NULL },
		{ "--text", ARG_STR, &text, 0, 0, NULL },
		{ NULL, 0, NULL, 0, 0, NULL },
	};
	const struct arg_flag *const tables[] = { flags, NULL };
	int rc = args_parse(&a, tables, argc, argv, err, sizeof(err));
	if (rc || !dir) {
		if (rc)
			fprintf(stderr, "meshrun: eval: %s\n", err);
		fprintf(stderr, "usage: meshrun eval --checkpoint DIR [--text FILE] [key=value ...]\n");
		args_release(&a);
		return EXIT_USAGE;
	}
	rc = eval_cfg(&c, dir, text, &a, err, sizeof(err));
	args_release(&a);
	if (!rc) {
		util_blas_threads(&c, 1);
		rc = eval_run(&c, dir, err, sizeof(err));
	}
	if (rc)
		fprintf(stderr, "%s\n", err);
	return cli_exit_code(rc);
}
