/* See host/obs/steplog.h. */
#include "host/obs/steplog.h"

#include <cJSON.h>
#include <errno.h>
#include <inttypes.h>
#include <string.h>
#include <unistd.h>

#include "host/util/clock.h"

/* The step log is an output too: stdout redirected to a full disk fails
 * the run like any other file. */
static int flush_stdout(char *err, size_t errlen)
{
	char es[128];
	if (!ferror(stdout) && !fflush(stdout))
		return 0;
	int e = errno ? errno : EIO;
	snprintf(err, errlen, "step log: unable to write to stdout: %s", util_errstr(e, es, sizeof(es)));
	return -e;
}

int steplog_open(struct steplog *l, const struct steplog_info *info, const char *metrics,
		 bool append, char *err, size_t errlen)
{
	memset(l, 0, sizeof(*l));
	l->metrics.fd = -1;
	l->opened = true;
	l->devices = info->devices;
	l->flops_per_token = info->flops_per_token;
	l->tokens_per_step = info->tokens_per_step;
	l->peak_gflops = info->peak_gflops;
	l->total_steps = info->total_steps;
	l->mode = info->quiet ? STEPLOG_QUIET
		  : isatty(STDOUT_FILENO) ? STEPLOG_PROGRESS : STEPLOG_LINES;
	int rc = metrics ? util_log_open(&l->metrics, "metrics", metrics, append, err, errlen) : 0;
	if (rc)
		return rc;
	if (l->metrics.cut)
		fprintf(stderr, "meshrun: metrics: '%s' ended in a partial line (its writer stopped "
			"mid-line); cut it before appending\n", metrics);
	if (l->mode == STEPLOG_QUIET)
		return 0;
	printf("sgemm peak: %.1f GFLOP/s per device (%d OpenBLAS threads, core %s, kernels %s); "
	       "model: %.3g matmul FLOPs/token\n",
	       l->peak_gflops, info->blas_threads, info->blas_core, info->kernel_isa,
	       l->flops_per_token);
	if (info->links && info->links[0])
		printf("links: %s\n", info->links);
	return flush_stdout(err, errlen);
}

static int write_metrics(struct steplog *l, const struct step_report *r, double tok_s,
			 double tflops, double mfu, long mem, char *err, size_t errlen)
{
	cJSON *j = cJSON_CreateObject();
	cJSON_AddNumberToObject(j, "step", (double)r->step);
	if (r->synthetic) {
		cJSON_AddStringToObject(j, "synthetic", "sleep");
	} else {
		cJSON_AddNumberToObject(j, "loss", r->loss);
		cJSON_AddNumberToObject(j, "aux_loss", r->aux);
		cJSON_AddNumberToObject(j, "grad_norm", r->grad_norm);
	}
	cJSON_AddNumberToObject(j, "lr", r->lr);
	cJSON_AddNumberToObject(j, "step_time_s", r->seconds);
	cJSON_AddNumberToObject(j, "tokens_per_s_global", tok_s);
	cJSON_AddNumberToObject(j, "tokens_per_s_per_device", tok_s / l->devices);
	cJSON_AddNumberToObject(j, "comm_wait_s", r->comm_wait_s);
	cJSON_AddNumberToObject(j, "comm_exposed_s", r->comm_wait_s);
	cJSON_AddNumberToObject(j, "comm_background_s", r->comm_bg_s);
	if (!r->synthetic) {
		cJSON_AddNumberToObject(j, "tflops_per_device", tflops);
		cJSON_AddNumberToObject(j, "mfu", mfu);
	}
	cJSON_AddNumberToObject(j, "dcn_bytes", (double)r->dcn_bytes);
	cJSON_AddNumberToObject(j, "ici_bytes", (double)r->ici_bytes);
	cJSON_AddNumberToObject(j, "peak_mem_mb", (double)mem);
	cJSON_AddNumberToObject(j, "rss_mb", util_rss_mb());
	cJSON_AddNumberToObject(j, "data_time_s", r->data_s);
	if (r->data_epoch >= 0)
		cJSON_AddNumberToObject(j, "data_epoch", (double)r->data_epoch);
	cJSON_AddNumberToObject(j, "reconnects", (double)r->reconnects);
	cJSON_AddNumberToObject(j, "frames_resent", (double)r->frames_resent);
	cJSON_AddNumberToObject(j, "messages", (double)r->messages);
	if (r->ahead)
		cJSON_AddStringToObject(j, "update_ahead", r->ahead);
	if (r->weight_gathers) {
		cJSON_AddNumberToObject(j, "weight_gathers", r->weight_gathers);
		cJSON_AddNumberToObject(j, "window_copies", r->window_copies);
	}
	if (r->muon_ns > 0) {
		cJSON_AddNumberToObject(j, "muon_ns_matrices", r->muon_ns);
		cJSON_AddNumberToObject(j, "muon_bytes", r->muon_bytes);
		cJSON_AddNumberToObject(j, "muon_ns_gflop", r->muon_gflop[0]);
		cJSON_AddNumberToObject(j, "muon_ns_gflop_max_device", r->muon_gflop[1]);
		cJSON_AddNumberToObject(j, "muon_ns_gflop_min_device", r->muon_gflop[2]);
	}
	/* losses printed with full precision so runs can be compared bit for bit */
	char buf[64];
	snprintf(buf, sizeof(buf), "%a", r->loss);
	if (!r->synthetic)
		cJSON_AddStringToObject(j, "loss_hex", buf);
	if (r->eval_tokens > 0) {
		cJSON_AddNumberToObject(j, "eval_loss", r->eval_loss);
		cJSON_AddNumberToObject(j, "eval_tokens", (double)r->eval_tokens);
		snprintf(buf, sizeof(buf), "%a", r->eval_loss);
		cJSON_AddStringToObject(j, "eval_loss_hex", buf);
	}
	char *s = cJSON_PrintUnformatted(j);
	cJSON_Delete(j);
	if (!s)
		return util_file_err(err, errlen, "metrics", "write", l->metrics.path, ENOMEM);
	int rc = util_log_line(&l->metrics, s, err, errlen);
	cJSON_free(s);
	return rc;
}

/* "step 12/100  loss 4.1306  52,310 tokens/s  ETA 0:42" over the last one */
static void progress_line(struct steplog *l, const struct step_report *r, double tok_s)
{
	int64_t left = l->total_steps - 1 - r->step;
	l->step_s_sum += r->seconds;
	l->steps_seen++;
	double eta = left > 0 ? l->step_s_sum / (double)l->steps_seen * (double)left : 0;
	long e = (long)(eta + 0.5);
	char loss[32] = "-";
	if (!r->synthetic)
		snprintf(loss, sizeof(loss), "%.4f", r->loss);
	printf("\r\033[Kstep %" PRId64 "/%" PRId64 "  loss %s  %.0f tokens/s  ETA %ld:%02ld:%02ld",
	       r->step + 1, l->total_steps, loss, tok_s, e / 3600, e / 60 % 60, e % 60);
	l->line_open = left > 0;
	if (!l->line_open)
		putchar('\n');
}

int steplog_step(struct steplog *l, const struct step_report *r, char *err, size_t errlen)
{
	double tok_s = l->tokens_per_step / r->seconds;
	double tflops = tok_s * l->flops_per_token / l->devices * 1e-12;
	double mfu = l->peak_gflops > 0 ? tflops * 1e3 / l->peak_gflops : 0;
	long mem = util_peak_rss_mb();

	int rc = 0;
	if (l->mode == STEPLOG_PROGRESS) {
		progress_line(l, r, tok_s);
		if (r->eval_tokens > 0) {
			char note[128];
			snprintf(note, sizeof(note), "eval after step %" PRId64 ": eval_loss %.5f over %"
				 PRId64 " tokens", r->step, r->eval_loss, r->eval_tokens);
			steplog_note(l, note);
		}
		rc = flush_stdout(err, errlen);
	}
	if (l->mode != STEPLOG_LINES)
		return !rc && l->metrics.fd >= 0 ? write_metrics(l, r, tok_s, tflops, mfu, mem, err, errlen) : rc;

	/* synthetic compute does no FLOPs: no throughput, no MFU, no loss */
	if (r->synthetic)
		printf("completed step: %" PRId64 ", seconds: %.3f, TFLOP/s/device: -, "
		       "Tokens/s/device: %.1f, MFU: -, loss: -, synthetic: sleep",
		       r->step, r->seconds, tok_s / l->devices);
	else
		printf("completed step: %" PRId64 ", seconds: %.3f, TFLOP/s/device: %.4f, "
		       "Tokens/s/device: %.1f, MFU: %.1f%%, loss: %.5f",
		       r->step, r->seconds, tflops, tok_s / l->devices, mfu * 100, r->loss);
	if (r->aux && !r->synthetic)
		printf(", aux_loss: %.5f", r->aux);
	if (!r->synthetic)
		printf(", grad_norm: %.4f", r->grad_norm);
	printf(", lr: %.3g, dcn_bytes: %" PRIu64 ", ici_bytes: %" PRIu64
	       ", peak_mem_mb: %ld", r->lr, r->dcn_bytes, r->ici_bytes, mem);
	/* only once a link broke: the usual line stays as it was */
	if (r->reconnects || r->frames_resent)
		printf(", reconnects: %" PRIu64 ", frames_resent: %" PRIu64, r->reconnects,
		       r->frames_resent);
	if (r->eval_tokens > 0)
		printf(", eval_loss: %.5f", r->eval_loss);
	printf("\n");
	if ((rc = flush_stdout(err, errlen)))
		return rc;
	return l->metrics.fd >= 0 ? write_metrics(l, r, tok_s, tflops, mfu, mem, err, errlen) : 0;
}

void steplog_note(struct steplog *l, const char *text)
{
	if (l->mode == STEPLOG_QUIET)
		return;
	if (l->line_open)
		putchar('\n');
	l->line_open = false;
	printf("%s\n", text);
	fflush(stdout);
}

int steplog_close(struct steplog *l, char *err, size_t errlen)
{
	int rc = 0;
	if (!l->opened)
		return 0;
	l->opened = false;
	if (l->line_open) {
		putchar('\n');
		l->line_open = false;
		rc = flush_stdout(err, errlen);
	}
	int mrc = util_log_close(&l->metrics, rc ? NULL : err, rc ? 0 : errlen);
	return rc ? rc : mrc;
}
