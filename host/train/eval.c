/* See host/train/eval.h. */
#include "host/train/eval.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>

#include "host/train/data.h"
#include "host/train/train.h"

int eval_text(struct trainer *t, const char *file, struct eval_result *r, char *err, size_t errlen)
{
	struct model *m = trainer_model(t);
	const struct model_dims *d = model_dims(m);
	struct dataset *ds = trainer_data(t);
	int B = trainer_rows(t), L = d->T;
	int64_t n = data_text_windows(ds, L);
	if (n <= 0) {
		snprintf(err, errlen, "'%s' is shorter than one window of %d bytes", file, L + 1);
		return -EBADMSG;
	}
	int32_t *in = calloc((size_t)B * L, sizeof(int32_t)), *tg = calloc((size_t)B * L, sizeof(int32_t));
	if (!in || !tg) {
		free(in);
		free(tg);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
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
	r->windows = n;
	r->tokens = n * L;
	r->loss = sum / ((double)n * L);
	return 0;
}
