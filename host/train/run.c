/* Step log (MaxText-like), --metrics JSON lines, and `meshrun train` /
 * `meshrun eval` on one device. */
#include "host/train/run.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host/bench/bench_matmul.h"
#include "host/cli/cli.h"
#include "host/train/data.h"
#include "host/util/clock.h"
#include "kernels/kernels.h"

int run_agents_on_machine(void)
{
	const char *v = getenv("MESHRUN_LOCAL_AGENTS");
	int n = v ? atoi(v) : 1;
	return n > 0 ? n : 1;
}

int run_blas_threads(const struct cfg *c, int devices_on_machine)
{
	long cores = sysconf(_SC_NPROCESSORS_ONLN);
	int n = (int)c->openblas_threads;
	if (n <= 0) {
		n = (int)(cores / (devices_on_machine > 0 ? devices_on_machine : 1));
		if (n < 1)
			n = 1;
	}
	blas_set_threads(n);
	return n;
}

int run_parse_flags(int *argc, char **argv, struct run_opts *o, char *err, size_t errlen)
{
	int out = 0;
	memset(o, 0, sizeof(*o));
	for (int i = 0; i < *argc; i++) {
		const char **slot = NULL;
		if (!strcmp(argv[i], "--metrics"))
			slot = &o->metrics;
		else if (!strcmp(argv[i], "--checkpoint-dir"))
			slot = &o->ckpt_dir;
		else if (!strcmp(argv[i], "--trace"))
			slot = &o->trace;
		else if (!strcmp(argv[i], "--resume")) {
			o->resume = true;
			continue;
		}
		if (!slot) {
			argv[out++] = argv[i];
			continue;
		}
		if (i + 1 >= *argc) {
			snprintf(err, errlen, "meshrun: %s needs a value", argv[i]);
			return EXIT_USAGE;
		}
		*slot = argv[++i];
	}
	*argc = out;
	argv[out] = NULL;
	if (o->resume && !o->ckpt_dir) {
		snprintf(err, errlen, "meshrun: --resume needs --checkpoint-dir DIR");
		return EXIT_USAGE;
	}
	return 0;
}

int run_log_open(struct run_log *l, const struct run_opts *o, const struct cfg *c,
		 const struct model_dims *d, int devices, char *err, size_t errlen)
{
	memset(l, 0, sizeof(*l));
	l->devices = devices;
	l->flops_per_token = model_flops_per_token(d);
	l->tokens_per_step = (int64_t)c->per_device_batch_size * devices * d->T;
	l->peak_gflops = bench_sgemm_peak_gflops(blas_get_threads(), 0.3);
	if (o->metrics) {
		l->metrics = fopen(o->metrics, o->resume ? "a" : "w");
		if (!l->metrics) {
			snprintf(err, errlen, "meshrun: unable to open metrics file '%s': %s",
				 o->metrics, strerror(errno));
			return EXIT_INPUT;
		}
	}
	printf("sgemm peak: %.1f GFLOP/s per device (%d OpenBLAS threads, core %s); "
	       "model: %.3g matmul FLOPs/token\n",
	       l->peak_gflops, blas_get_threads(), blas_core_name(), l->flops_per_token);
	fflush(stdout);
	return 0;
}

void run_log_step(struct run_log *l, int64_t step, const struct step_stats *st, double seconds,
		  uint64_t dcn_bytes, uint64_t ici_bytes)
{
	double tok_s = l->tokens_per_step / seconds;
	double tflops = tok_s * l->flops_per_token / l->devices * 1e-12;
	double mfu = l->peak_gflops > 0 ? tflops * 1e3 / l->peak_gflops : 0;
	long mem = util_peak_rss_mb();

	printf("completed step: %" PRId64 ", seconds: %.3f, TFLOP/s/device: %.4f, "
	       "Tokens/s/device: %.1f, MFU: %.1f%%, loss: %.5f",
	       step, seconds, tflops, tok_s / l->devices, mfu * 100, st->loss);
	if (st->aux)
		printf(", aux_loss: %.5f", st->aux);
	printf(", grad_norm: %.4f, lr: %.3g, dcn_bytes: %" PRIu64 ", ici_bytes: %" PRIu64
	       ", peak_mem_mb: %ld\n", st->grad_norm, st->lr, dcn_bytes, ici_bytes, mem);
	fflush(stdout);
	if (l->metrics) {
		cJSON *j = cJSON_CreateObject();
		cJSON_AddNumberToObject(j, "step", (double)step);
		cJSON_AddNumberToObject(j, "loss", st->loss);
		cJSON_AddNumberToObject(j, "aux_loss", st->aux);
		cJSON_AddNumberToObject(j, "grad_norm", st->grad_norm);
		cJSON_AddNumberToObject(j, "lr", st->lr);
		cJSON_AddNumberToObject(j, "step_time_s", seconds);
		cJSON_AddNumberToObject(j, "tokens_per_s", tok_s);
		cJSON_AddNumberToObject(j, "tflops_per_device", tflops);
		cJSON_AddNumberToObject(j, "mfu", mfu);
		cJSON_AddNumberToObject(j, "dcn_bytes", (double)dcn_bytes);
		cJSON_AddNumberToObject(j, "ici_bytes", (double)ici_bytes);
		cJSON_AddNumberToObject(j, "peak_mem_mb", (double)mem);
		/* losses printed with full precision so runs can be compared bit for bit */
		char buf[64];
		snprintf(buf, sizeof(buf), "%a", st->loss);
		cJSON_AddStringToObject(j, "loss_hex", buf);
		char *s = cJSON_PrintUnformatted(j);
		fprintf(l->metrics, "%s\n", s);
		fflush(l->metrics);
		cJSON_free(s);
		cJSON_Delete(j);
	}
}

void run_log_close(struct run_log *l)
{
	if (l->metrics)
		fclose(l->metrics);
	l->metrics = NULL;
}

/* Loads --config and key=value overrides from argv (after flags are
 * removed). */
static int load_cfg_args(int argc, char **argv, struct cfg *c, char *err, size_t errlen)
{
	const char *file = NULL;
	cfg_defaults(c);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--config")) {
			if (i + 1 >= argc) {
				snprintf(err, errlen, "meshrun: --config needs a file");
				return EXIT_USAGE;
			}
			file = argv[++i];
			if (cfg_load_file(c, file, err, errlen))
				return EXIT_CONFIG;
		} else if (argv[i][0] == '-') {
			snprintf(err, errlen, "meshrun: unknown option '%s'", argv[i]);
			return EXIT_USAGE;
		} else if (cfg_override(c, argv[i], err, errlen)) {
			return EXIT_CONFIG;
		}
	}
	return 0;
}

int cmd_train(int argc, char **argv)
{
	struct run_opts o;
	struct cfg c;
	struct run_log log;
	char err[1024];
	int rc;
	int64_t start = 0;

	if ((rc = run_parse_flags(&argc, argv, &o, err, sizeof(err))) ||
	    (rc = load_cfg_args(argc, argv, &c, err, sizeof(err))))
		goto out_err;
	if (cfg_finish(&c, 1, 1, err, sizeof(err))) {
		rc = EXIT_CONFIG;
		goto out_err;
	}
	run_blas_threads(&c, 1);
	struct trainer *t = trainer_new(&c, (int)c.per_device_batch_size, NULL, err, sizeof(err));
	if (!t) {
		rc = strncmp(err, "config", 6) ? EXIT_INPUT : EXIT_CONFIG;
		goto out_err;
	}
	if (o.resume && trainer_load(t, o.ckpt_dir, &start, err, sizeof(err))) {
		rc = EXIT_INPUT;
		goto out_free;
	}
	if ((rc = run_log_open(&log, &o, &c, model_dims(trainer_model(t)), 1, err, sizeof(err))))
		goto out_free;
	for (int64_t s = start; s < c.steps; s++) {
		struct step_stats st;
		double t0 = util_now_s();
		trainer_step(t, s, (int)c.per_device_batch_size, 0, NULL, &st, err, sizeof(err));
		double dt = util_now_s() - t0;
		if (!isfinite(st.loss)) {
			snprintf(err, sizeof(err), "train: loss is %g at step %" PRId64, st.loss, s);
			rc = EXIT_FAIL;
			break;
		}
		if (c.log_period > 0 && (s % c.log_period == 0 || s == c.steps - 1))
			run_log_step(&log, s, &st, dt, 0, 0);
		bool last = s == c.steps - 1;
		if (o.ckpt_dir && ((c.checkpoint_period > 0 && (s + 1) % c.checkpoint_period == 0) || last)) {
			if (trainer_save(t, o.ckpt_dir, s + 1, err, sizeof(err))) {
				rc = EXIT_FAIL;
				break;
			}
		}
	}
	run_log_close(&log);
out_free:
	trainer_free(t);
out_err:
	if (rc)
		fprintf(stderr, "%s\n", err);
	return rc;
}

/* Mean next-token cross-entropy over the windows of the trainer's text. */
static int eval_text(struct trainer *t, const char *file, char *err, size_t errlen)
{
	struct model *m = trainer_model(t);
	const struct model_dims *d = model_dims(m);
	struct dataset *ds = trainer_data(t);
	int B = trainer_rows(t), L = d->T;
	int64_t n = data_text_windows(ds, L);
	if (n <= 0) {
		snprintf(err, errlen, "'%s' is shorter than one window of %d bytes", file, L + 1);
		return EXIT_INPUT;
	}
	int32_t *in = calloc((size_t)B * L, sizeof(int32_t)), *tg = calloc((size_t)B * L, sizeof(int32_t));
	if (!in || !tg) {
		free(in);
		free(tg);
		snprintf(err, errlen, "out of memory");
		return EXIT_FAIL;
	}
	double sum = 0;
	for (int64_t w = 0; w < n; w += B) {
		int rows = (int)(n - w < B ? n - w : B);
		for (int r = 0; r < rows; r++)
			data_text_window(ds, w + r, L, in + (size_t)r * L, tg + (size_t)r * L);
		sum += model_forward(m, in, tg, rows);
	}
	free(in);
	free(tg);
	printf("eval_windows: %" PRId64 "\neval_tokens: %" PRId64 "\neval_loss: %.6f\n", n, n * L, sum / ((double)n * L));
	return 0;
}

int cmd_eval(int argc, char **argv)
{
	const char *dir = NULL, *text = NULL;
	struct cfg c;
	char err[1024], path[4096];
	int rc = 0, n = 0;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--checkpoint") && i + 1 < argc)
			dir = argv[++i];
		else if (!strcmp(argv[i], "--text") && i + 1 < argc)
			text = argv[++i];
		else
			argv[1 + n++] = argv[i];
	}
	if (!dir || !text) {
		fprintf(stderr, "usage: meshrun eval --checkpoint DIR --text FILE [key=value ...]\n");
		return EXIT_USAGE;
	}
	cfg_defaults(&c);
	snprintf(path, sizeof(path), "%s/meshrun.yml", dir);
	if (cfg_load_file(&c, path, err, sizeof(err))) {
		fprintf(stderr, "eval: %s\n", err);
		return EXIT_INPUT;
	}
	for (int i = 0; i < n; i++)
		if (cfg_override(&c, argv[1 + i], err, sizeof(err))) {
			fprintf(stderr, "%s\n", err);
			return EXIT_CONFIG;
		}
	/* eval runs on one device whatever mesh trained the checkpoint */
	cfg_single_device(&c);
	snprintf(c.dataset_type, sizeof(c.dataset_type), "text");
	snprintf(c.dataset_path, sizeof(c.dataset_path), "%s", text);
	if (cfg_finish(&c, 1, 1, err, sizeof(err))) {
		fprintf(stderr, "%s\n", err);
		return EXIT_CONFIG;
	}
	run_blas_threads(&c, 1);
	struct trainer *t = trainer_new(&c, (int)c.per_device_batch_size, NULL, err, sizeof(err));
	if (!t) {
		fprintf(stderr, "eval: %s\n", err);
		return EXIT_INPUT;
	}
	if (trainer_load(t, dir, NULL, err, sizeof(err))) {
		fprintf(stderr, "eval: %s\n", err);
		trainer_free(t);
		return EXIT_INPUT;
	}
	rc = eval_text(t, text, err, sizeof(err));
	if (rc)
		fprintf(stderr, "eval: %s\n", err);
	trainer_free(t);
	return rc;
}
