/* Mesh: coordinates, host and local index round-trip; groups for several
 * axis sets on a mesh with DCN and ICI parts (members, host-major order,
 * equal ids, a partition of the devices). */
#include <check.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "host/config/config.h"
#include "host/mesh/mesh.h"

/* dcn_data=2, ici_fsdp=2, ici_tensor=2: 2 hosts x 4 devices */
static void mesh_dcn_ici(struct mesh *m)
{
	struct cfg c;
	char err[256];
	cfg_defaults(&c);
	c.dcn_data_parallelism = 2;
	c.ici_data_parallelism = 1;
	c.ici_fsdp_parallelism = 2;
	c.ici_tensor_parallelism = 2;
	ck_assert_msg(cfg_finish(&c, 2, 4, err, sizeof(err)) == 0, "%s", err);
	mesh_init(m, &c);
}

/* DCN on a middle axis: ici_data=2, dcn_fsdp=3, ici_tensor=2 */
static void mesh_dcn_middle(struct mesh *m)
{
	struct cfg c;
	char err[256];
	cfg_defaults(&c);
	c.ici_data_parallelism = 2;
	c.dcn_data_parallelism = 1;
	c.dcn_fsdp_parallelism = 3;
	c.ici_tensor_parallelism = 2;
	ck_assert_msg(cfg_finish(&c, 3, 4, err, sizeof(err)) == 0, "%s", err);
	mesh_init(m, &c);
}

static void check_round_trip(const struct mesh *m)
{
	int per_host[64] = { 0 };
	ck_assert_int_eq(m->num_devices, m->num_hosts * m->devices_per_host);
	for (int d = 0; d < m->num_devices; d++) {
		int c[AX_COUNT];
		mesh_coords(m, d, c);
		for (int a = 0; a < AX_COUNT; a++)
			ck_assert(c[a] >= 0 && c[a] < m->size[a]);
		ck_assert_int_eq(mesh_device(m, c), d);
		int h = mesh_host_of(m, d), l = mesh_local_index(m, d);
		ck_assert(h >= 0 && h < m->num_hosts);
		ck_assert(l >= 0 && l < m->devices_per_host);
		ck_assert_int_eq(mesh_device_of(m, h, l), d);
		per_host[h]++;
	}
	for (int h = 0; h < m->num_hosts; h++)
		ck_assert_int_eq(per_host[h], m->devices_per_host);
}

START_TEST(test_round_trip)
{
	struct mesh m;
	mesh_dcn_ici(&m);
	ck_assert_int_eq(m.num_hosts, 2);
	ck_assert_int_eq(m.devices_per_host, 4);
	check_round_trip(&m);
	/* device 5 = data 1, fsdp 0, tensor 1: host 1, local 1 */
	int c[AX_COUNT];
	mesh_coords(&m, 5, c);
	ck_assert_int_eq(c[AX_DATA], 1);
	ck_assert_int_eq(c[AX_FSDP], 0);
	ck_assert_int_eq(c[AX_TENSOR], 1);
	ck_assert_int_eq(mesh_host_of(&m, 5), 1);
	ck_assert_int_eq(mesh_local_index(&m, 5), 1);

	mesh_dcn_middle(&m);
	ck_assert_int_eq(m.num_hosts, 3);
	check_round_trip(&m);
	/* fsdp coordinate = dcn_idx * ici(1) + ici_idx: the host */
	for (int d = 0; d < m.num_devices; d++) {
		mesh_coords(&m, d, c);
		ck_assert_int_eq(mesh_host_of(&m, d), c[AX_FSDP]);
	}
}
END_TEST

static const uint32_t axes_sets[] = {
	0,
	1u << AX_DATA,
	1u << AX_FSDP,
	1u << AX_TENSOR,
	(1u << AX_FSDP) | (1u << AX_TENSOR),
	(1u << AX_DATA) | (1u << AX_TENSOR),
	(1u << AX_DATA) | (1u << AX_FSDP) | (1u << AX_TENSOR),
};

/* Members are always in ring order: host-major, then local index.
 * coord_order: the mesh is one where that also is the coordinate order over
 * the group's axes (no ICI-sharded axis precedes a DCN-sharded one); for a
 * single axis it always is. */
static void check_groups(const struct mesh *m, bool coord_order)
{
	static struct mesh_group g, h;
	uint32_t seen_ids[16];
	for (size_t k = 0; k < sizeof(axes_sets) / sizeof(axes_sets[0]); k++) {
		uint32_t axes = axes_sets[k];
		int want_n = 1;
		for (int a = 0; a < AX_COUNT; a++)
			if (axes & (1u << a))
				want_n *= m->size[a];
		int member_of[64];
		memset(member_of, 0, sizeof(member_of));
		for (int d = 0; d < m->num_devices; d++) {
			mesh_group(m, d, axes, &g);
			ck_assert_int_eq(g.n, want_n);
			ck_assert_int_eq(g.devs[g.rank], d);
			seen_ids[k] = g.id;
			int cd[AX_COUNT], ci[AX_COUNT], cp[AX_COUNT];
			mesh_coords(m, d, cd);
			for (int i = 0; i < g.n; i++) {
				mesh_coords(m, g.devs[i], ci);
				/* same coordinates outside axes */
				for (int a = 0; a < AX_COUNT; a++)
					if (!(axes & (1u << a)))
						ck_assert_int_eq(ci[a], cd[a]);
				if (i > 0) {
					int hp = mesh_host_of(m, g.devs[i - 1]), hi = mesh_host_of(m, g.devs[i]);
					ck_assert_int_le(hp, hi);
					if (hp == hi)
						ck_assert_int_lt(mesh_local_index(m, g.devs[i - 1]),
								 mesh_local_index(m, g.devs[i]));
					mesh_coords(m, g.devs[i - 1], cp);
					int cmp = 0;
					for (int a = 0; a < AX_COUNT && !cmp; a++)
						if (axes & (1u << a))
							cmp = (cp[a] > ci[a]) - (cp[a] < ci[a]);
					if (coord_order || __builtin_popcount(axes) == 1)
						ck_assert_int_lt(cmp, 0);
				}
				/* every member computes the same group */
				mesh_group(m, g.devs[i], axes, &h);
				ck_assert_int_eq(h.id, g.id);
				ck_assert_int_eq(h.n, g.n);
				ck_assert_int_eq(h.rank, i);
				ck_assert(!memcmp(h.devs, g.devs, sizeof(int) * (size_t)g.n));
			}
			if (g.rank == 0)
				for (int i = 0; i < g.n; i++)
					member_of[g.devs[i]]++;
		}
		/* the groups of one axes set partition the devices */
		for (int d = 0; d < m->num_devices; d++)
			ck_assert_int_eq(member_of[d], 1);
		/* distinct axes sets get distinct ids */
		for (size_t j = 0; j < k; j++)
			ck_assert_uint_ne(seen_ids[j], seen_ids[k]);
	}
}

START_TEST(test_groups)
{
	struct mesh m;
	mesh_dcn_ici(&m);
	check_groups(&m, true);
	/* data groups cross hosts, fsdp x tensor groups stay inside one */
	static struct mesh_group g;
	mesh_group(&m, 6, 1u << AX_DATA, &g);
	ck_assert_int_eq(g.n, 2);
	ck_assert_int_eq(g.devs[0], 2);
	ck_assert_int_eq(g.devs[1], 6);
	ck_assert_int_eq(g.rank, 1);
	mesh_group(&m, 6, (1u << AX_FSDP) | (1u << AX_TENSOR), &g);
	ck_assert_int_eq(g.n, 4);
	for (int i = 0; i < 4; i++) {
		ck_assert_int_eq(g.devs[i], 4 + i);
		ck_assert_int_eq(mesh_host_of(&m, g.devs[i]), 1);
	}
	mesh_dcn_middle(&m);
	check_groups(&m, false);
}
END_TEST

int main(void)
{
	Suite *s = suite_create("mesh");
	TCase *tc = tcase_create("coords");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_round_trip);
	suite_add_tcase(s, tc);
	tc = tcase_create("groups");
	tcase_set_timeout(tc, 10);
	tcase_add_test(tc, test_groups);
	suite_add_tcase(s, tc);
	SRunner *sr = srunner_create(s);
	srunner_run_all(sr, CK_NORMAL);
	int failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	return failed ? EXIT_FAILURE : EXIT_SUCCESS;
}
