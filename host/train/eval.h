/* Evaluation on one device: mean next-token cross-entropy over every
 * window of a text file. */
#ifndef MESHRUN_EVAL_H
#define MESHRUN_EVAL_H

#include <stddef.h>
#include <stdint.h>

struct trainer;

struct eval_result {
	int64_t windows, tokens;
	double loss;             /* mean over every token */
};

/* Runs the trainer's model over every window of its text data (the
 * trainer was opened with dataset_type text; file names it in messages).
 * 0; -EBADMSG when the text is shorter than one window; -ENOMEM. */
int eval_text(struct trainer *t, const char *file, struct eval_result *r, char *err, size_t errlen);

#endif
