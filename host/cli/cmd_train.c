/* `meshrun train` and `meshrun eval`: one device. */
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "host/cli/args.h"
#include "host/cli/cli.h"
#include "host/cli/cmds.h"
#include "host/ckpt/ckpt.h"
#include "host/ckpt/hf_config.h"
#include "host/ckpt/hf_load.h"
#include "host/config/config.h"
#include "host/data/data.h"
#include "host/mesh/mesh.h"
#include "host/train/check.h"
#include "host/train/loop.h"
#include "host/train/preflight.h"
#include "host/train/train.h"
#include "host/util/threads.h"

/* The weights of load_parameters_path into t's model (one device):
 * every tensor checked, then read; one line on what was read. */
static int load_weights(struct trainer *t, const char *dir, bool say, char *err, size_t errlen)
{
	struct hf_src *src;
	struct model *m = trainer_model(t);
	char line[1024];
	int rc = hf_src_open(&src, dir, 1, err, errlen);
	if (rc)
		return rc;
	rc = hf_src_done(src, hf_src_load(src, m, model_params(m), err, errlen), err, errlen);
	hf_src_summary(src, line, sizeof(line));
	if (!rc)
		fprintf(say ? stdout : stderr, "%s\n", line);
	hf_src_close(src);
	return rc;
}

static int train_run(const struct cfg *c, const struct train_opts *o, char *err, size_t errlen)
{
	struct trainer *t;
	struct steplog log = { 0 };
	int64_t start = 0;
	int rc = trainer_open(&t, c, (int)c->per_device_batch_size, NULL, err, errlen);
	if (rc)
		return rc;
	/* --resume continues the run's own checkpoint; the weights to start
	 * from matter only at the start */
	if (o->resume && (rc = trainer_load(t, o->ckpt_dir, &start, err, errlen)))
		goto out;
	if (!o->resume && c->load_parameters_path[0] &&
	    (rc = load_weights(t, c->load_parameters_path, !o->quiet, err, errlen)))
		goto out;
	if ((rc = train_log_open(&log, o, t, 1, NULL, err, errlen)))
		goto out;
	struct train_loop loop = {
		.t = t, .opts = o, .global_rows = (int)c->per_device_batch_size, .leader = true,
		.log = &log,
	};
	rc = train_loop_run(&loop, start, err, errlen);
out:
	if (!rc)
		rc = steplog_close(&log, err, errlen);
	else
		steplog_close(&log, NULL, 0);
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
		/* accepted and ignored before: train writes no trace */
		{ "--trace", ARG_REFUSE, NULL, 0, 0,
		  "--trace is for local and agent (train writes no trace; local --hosts 1 does)" },
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
		args_release(&a);
		return cli_usage_error("train", "%s", err);
	}
	rc = args_load_cfg(&a, &c, err, sizeof(err));
	args_release(&a);
	bool loaded = !rc;   /* the loader's own errors say where already */
	struct train_outputs out = { .lock.fd = -1 };
	char job[128];
	struct mesh m;
	if (!rc && cfg_finish(&c, 1, 1, err, sizeof(err)))
		rc = -EINVAL;
	if (!rc) {
		mesh_init(&m, &c);
		rc = train_check(&c, &m, err, sizeof(err));
	}
	if (!rc)
		rc = train_preflight(&out, &c, &o, cli_job_name("train", job, sizeof(job)), err,
				     sizeof(err));
	if (!rc) {
		util_blas_threads(&c, 1);
		rc = train_run(&c, &o, err, sizeof(err));
		train_outputs_release(&out);
	}
	if (rc && loaded)   /* a key's range or shape error says where its value came from */
		cfg_error_origins(&c, err, sizeof(err));
	if (rc)
		cli_error("train", "%s", err);
	return cli_exit_code(rc);
}

/* The config eval runs: the checkpoint's (dir: a run's checkpoint
 * directory, whose newest step it takes, or one step directory; its
 * meshrun.yml, or for a Hugging Face model its config.json),
 * overridden, on one device. Its data is the held-out data the config
 * names (docs/data.md#evaluation); --text FILE is short for
 * eval_dataset_type=text eval_dataset_path=FILE eval_steps=-1. A
 * checkpoint without a readable meshrun.yml or config.json is bad input;
 * a bad override a config error. *hf: the weights come in as a Hugging
 * Face model's (load_parameters_path), not as a meshrun checkpoint's. */
static int eval_cfg(struct cfg *c, bool *hf, const char *dir, const char *text, const struct args *a,
		    char *err, size_t errlen)
{
	char path[4200], step_dir[4096], why[1024];
	int rc;
	cfg_defaults(c);
	if (ckpt_find(dir, step_dir, sizeof(step_dir), NULL, why, sizeof(why))) {
		snprintf(err, errlen, "%s", why);
		return -EBADMSG;
	}
	snprintf(path, sizeof(path), "%s/meshrun.yml", step_dir);
	*hf = access(path, F_OK) != 0;
	if (!*hf && cfg_load_file(c, path, why, sizeof(why))) {
		snprintf(err, errlen, "%s", why);
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
	if (*hf) {
		if (strlen(step_dir) >= sizeof(c->load_parameters_path)) {
			snprintf(err, errlen, "checkpoint path '%.300s' is too long", step_dir);
			return -EINVAL;
		}
		memcpy(c->load_parameters_path, step_dir, strlen(step_dir) + 1);
		if ((rc = hf_config_apply(c, a->overrides, a->noverrides, why, sizeof(why)))) {
			snprintf(err, errlen, "%s", why);
			return rc;
		}
	}
	/* eval runs on one device whatever mesh trained the checkpoint */
	cfg_single_device(c);
	return cfg_finish(c, 1, 1, err, errlen) ? -EINVAL : 0;
}

static int eval_run(const struct cfg *c, bool hf, const char *dir, char *err, size_t errlen)
{
	struct trainer *t;
	char why[1024];
	int B = (int)c->per_device_batch_size;
	double loss;
	int64_t tokens;
	int rc = trainer_open_eval(&t, c, B, NULL, why, sizeof(why));
	if (!rc)
		rc = hf ? load_weights(t, c->load_parameters_path, false, why, sizeof(why))
			: trainer_load(t, dir, NULL, why, sizeof(why));
	if (!rc && (rc = trainer_eval(t, B, 0, NULL, &loss, &tokens, why, sizeof(why))) == 0 &&
	    !isfinite(loss)) {
		/* not a loss: no number a script could take for one */
		snprintf(why, sizeof(why), "the loss over %" PRId64 " tokens is %s: the checkpoint's "
			 "weights (or the data) give no finite loss", tokens,
			 isnan(loss) ? "nan" : loss > 0 ? "inf" : "-inf");
		rc = -ERANGE;
	}
	if (!rc) {
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
		snprintf(err, errlen, "%s", why);
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
		args_release(&a);
		return cli_usage_error("eval", "%s", rc ? err : "--checkpoint DIR is needed");
	}
	bool hf = false;
	rc = eval_cfg(&c, &hf, dir, text, &a, err, sizeof(err));
	args_release(&a);
	if (!rc) {
		util_blas_threads(&c, 1);
		rc = eval_run(&c, hf, dir, err, sizeof(err));
	}
	if (rc)
		cli_error("eval", "%s", err);
	return cli_exit_code(rc);
}
