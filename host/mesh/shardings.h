/* The description `meshrun shardings` prints: every parameter's,
 * activation's and optimizer state's logical axes, partition spec, global
 * and local shapes and bytes per device, and each linear layer's planned
 * gathers and reductions, for the mesh a config describes. Allocates no
 * model, so it works for models too big for the machine. */
#ifndef MESHRUN_SHARDINGS_H
#define MESHRUN_SHARDINGS_H

#include <stddef.h>

struct cfg;

/* Finishes c for hosts x devs (0: what the config's dcn_* / ici_* sizes
 * multiply to, -1 counting as 1), runs the trainer's checks
 * (train_check, host/train/check.h: what the trainer would refuse is
 * refused here, with the same line) and prints the tables to stdout. 0,
 * or -EINVAL (the config, a shape or a sharding the trainer refuses) or
 * -ENOMEM with err. */
int shardings_describe(struct cfg *c, int hosts, int devs, char *err, size_t errlen);

#endif
