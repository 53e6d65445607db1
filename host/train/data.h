/* Training and evaluation data: token rows that depend only on (seed, step,
 * row), never on how the global batch is split across devices, so 1 device
 * with 8 rows and 4 devices with 2 rows each train on the same data.
 *
 * Row hash: h(seed, s, r) = mix(mix(mix(seed) ^ s) ^ r) on uint64 (s and r
 * converted from signed), mix being SplitMix64's finaliser applied to
 * x + 0x9e3779b97f4a7c15:
 *   x += 0x9e3779b97f4a7c15; x = (x ^ x>>30) * 0xbf58476d1ce4e5b9;
 *   x = (x ^ x>>27) * 0x94d049bb133111eb; x ^= x>>31.
 *
 * text:      byte-level tokens (vocab 256). Row r of step s is the window of
 *            T+1 bytes starting at h(seed, s, r) mod (len - T); inputs are
 *            its first T bytes, targets its last T.
 * synthetic: a fixed random successor function succ(x) = mix(x ^ K) mod V
 *            (K a constant, so every seed speaks the same "language").
 *            With x_t = mix(h + t * 0x9e3779b97f4a7c15), the t-th draw of
 *            the SplitMix64 stream seeded with h = h(seed, s, r): token 0 is
 *            x_0 mod V; token t is x_t mod V (noise) when the top 4 bits of
 *            x_t are zero (probability 1/16), else succ(token t-1). The best
 *            possible loss is the entropy of that mixture, about 0.58 nats
 *            for V = 256 against ln 256 = 5.55, and a bigram model reaches
 *            it.
 */
#ifndef MESHRUN_DATA_H
#define MESHRUN_DATA_H

#include <stddef.h>
#include <stdint.h>

struct cfg;
struct dataset;

/* Opens the dataset the config names (dataset_type, dataset_path,
 * data_shuffle_seed, vocab_size, max_target_length). A text file must be a
 * readable regular file of at least max_target_length+1 bytes and needs
 * vocab_size >= 256. NULL with a one-line err naming the file or key. */
struct dataset *data_open(const struct cfg *c, char *err, size_t errlen);
void data_close(struct dataset *d);

/* Sequence length T (max_target_length) and vocabulary size. */
int data_seq_len(const struct dataset *d);
int data_vocab(const struct dataset *d);
/* Bytes of the text file; 0 for synthetic data. */
int64_t data_text_len(const struct dataset *d);

/* Fills rows [row0, row0+nrows) of the global batch of global_batch rows
 * for training step `step`: inputs and targets are (nrows, T), targets are
 * inputs shifted by one. Row r depends only on (seed, step, r). Requires
 * 0 <= row0 and row0 + nrows <= global_batch. */
void data_batch(const struct dataset *d, int64_t step, int global_batch, int row0, int nrows,
		int32_t *inputs, int32_t *targets);

/* Evaluation over a text file, as `meshrun eval` defines it: the file is
 * split into consecutive non-overlapping windows of L+1 bytes; window w
 * covers bytes [w (L+1), w (L+1) + L]; inputs are its first L, targets its
 * last L. (So the byte at each window boundary is never a target; that is
 * the definition the eval command promises.) data_text_windows returns the
 * number of whole windows, len / (L+1), or -EINVAL for synthetic data or
 * L < 1. data_text_window fills one window: 0, or -ERANGE when w is not in
 * [0, data_text_windows). */
int64_t data_text_windows(const struct dataset *d, int L);
int data_text_window(const struct dataset *d, int64_t w, int L, int32_t *inputs,
		     int32_t *targets);

#endif
