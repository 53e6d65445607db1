/* Small file-system helpers of host/. */
#ifndef MESHRUN_UTIL_FS_H
#define MESHRUN_UTIL_FS_H

/* Removes a directory that holds only files: its files, then itself.
 * Best effort (what cannot be removed stays). */
void util_remove_flat_dir(const char *dir);

#endif
