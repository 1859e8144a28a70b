/*
 * spank_colocate: a Slurm SPANK plugin that turns colocate's runtime on in a job's tasks.
 *
 * Build (Debian/Ubuntu: apt-get install gcc libslurm-dev):
 *   colocate slurm build-plugin /usr/local/lib/colocate/spank_colocate.so
 * (or gcc -shared -fPIC -O2 -Wall -o spank_colocate.so spank_colocate.c) and add one line to plugstack.conf
 * (`colocate slurm config --plugstack /etc/slurm/plugstack.conf` writes it with this site's paths):
 *   required /usr/local/lib/colocate/spank_colocate.so inject=DIR root=DIR node=ENDPOINT shards=S [device=KIND]
 *            [sim_gpu_mem=SIZE] [enforce=shard|all|none] [opp_gres=colocate_opp]
 *
 * The plugin only switches colocate on; it decides nothing per task. In a task that asks for colocate
 * (--colocate[=MODE], or a job GRES named by opp_gres=: opportunistic), or that holds GPU shards while
 * enforce=shard (the default) or any Slurm GPU while enforce=all, it sets
 *   COLOCATE_ENABLED=1 COLOCATE_ENGINE=slurm COLOCATE_NODE=ENDPOINT (%n: this node's name)
 *   COLOCATE_NODE_REQUIRED=1 COLOCATE_SLURM=MODE COLOCATE_SLURM_SHARDS=S COLOCATE_DEVICE=KIND
 *   [COLOCATE_SIM_GPU_MEM] [COLOCATE_GPU_MEM, COLOCATE_SM_SHARE: the user's lowering options]
 *   PYTHONPATH=INJECT:ROOT:$PYTHONPATH
 * and colocate.slurm.worker.resolve(environ) maps Slurm's grant (shards, GPUs, ranks) to limits when the
 * task imports torch. Any other task is left untouched. Site arguments are checked in every context: a bad
 * one fails srun/sbatch with one line naming it. A bad user option fails with Slurm's own one line
 * ("srun: error: Invalid --colocate argument: VALUE"; `srun --help` lists the values).
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <slurm/slurm.h>
#include <slurm/spank.h>

SPANK_PLUGIN(colocate, 1);

#define MAXV 1024

/* site arguments (plugstack.conf) */
static char inject_dir[MAXV];
static char root_dir[MAXV];
static char node_ep[MAXV];
static char shards[32];
static char device[16] = "sim";
static char sim_gpu_mem[64];
static int enforce = 1; /* 0 none: only tasks that ask; 1 shard: also tasks holding shards; 2 all: any GPU */
static char opp_gres[64]; /* a count-only GRES that makes a job opportunistic (e.g. colocate_opp); "": off */

/* user options */
static int asked = 0;
static char mode[32] = "auto";
static char gpu_mem[64];
static char sm_share[64];

static int is_size(const char *s)
{
	/* a number with an optional unit, as colocate.units.parse_size reads it */
	static const char *units[] = {"", "b", "kib", "mib", "gib", "tib", "kb", "mb", "gb", "tb",
				      "ki", "mi", "gi", "ti", "k", "m", "g", "t", NULL};
	char *end;
	char unit[8];
	size_t i;
	if (!s || !*s || !(isdigit((unsigned char)*s) || *s == '.'))
		return 0;
	if (strtod(s, &end) < 0 || end == s)
		return 0;
	if (strlen(end) >= sizeof(unit))
		return 0;
	for (i = 0; end[i]; i++)
		unit[i] = (char)tolower((unsigned char)end[i]);
	unit[i] = '\0';
	for (i = 0; units[i]; i++)
		if (strcmp(unit, units[i]) == 0)
			return 1;
	return 0;
}

static int is_fraction(const char *s)
{
	char *end;
	double v;
	if (!s || !*s)
		return 0;
	v = strtod(s, &end);
	return *end == '\0' && v >= 0.0 && v <= 1.0;
}

static int copy(char *dst, size_t size, const char *src, const char *what)
{
	if (strlen(src) >= size) {
		slurm_error("colocate: %s is too long (at most %zu characters)", what, size - 1);
		return -1;
	}
	strcpy(dst, src);
	return 0;
}

static int opt_colocate(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	asked = 1;
	/* a bare --colocate given to sbatch or salloc reaches the job's steps as the text "(null)" (Slurm exports
	 * the option's missing argument so): it is the same bare --colocate, auto */
	if (!optarg || !*optarg || !strcmp(optarg, "(null)"))
		optarg = "auto";
	if (strcmp(optarg, "auto") && strcmp(optarg, "guaranteed") && strcmp(optarg, "opportunistic"))
		return -1;
	return copy(mode, sizeof(mode), optarg, "--colocate");
}

static int opt_gpu_mem(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	asked = 1;
	/* a cap of 0 bytes would serve every allocation from host memory: not a size a task may lower to */
	return is_size(optarg) && strtod(optarg, NULL) > 0 ? copy(gpu_mem, sizeof(gpu_mem), optarg, "--colocate-gpu-mem")
							   : -1;
}

static int opt_sm_share(int val, const char *optarg, int remote)
{
	(void)val;
	(void)remote;
	asked = 1;
	return is_fraction(optarg) ? copy(sm_share, sizeof(sm_share), optarg, "--colocate-sm-share") : -1;
}

static struct spank_option options[] = {
	{"colocate", "[MODE]",
	 "run under colocate: MODE auto (default: guaranteed with --gres=gpu/shard, else opportunistic), "
	 "guaranteed, or opportunistic (no Slurm GPU: the node picks one and yields it to guaranteed work)",
	 2, 0, opt_colocate},
	{"colocate-gpu-mem", "SIZE", "colocate: lower the GPU memory cap below what Slurm granted (e.g. 2GiB)",
	 1, 0, opt_gpu_mem},
	{"colocate-sm-share", "F", "colocate: lower the compute share below what Slurm granted (0..1)",
	 1, 0, opt_sm_share},
	SPANK_OPTIONS_TABLE_END};

static int site_args(int ac, char **av)
{
	int i;
	for (i = 0; i < ac; i++) {
		const char *a = av[i];
		const char *v = strchr(a, '=');
		size_t k = v ? (size_t)(v - a) : strlen(a);
		int rc = 0;
		v = v ? v + 1 : "";
		if (k == 6 && !strncmp(a, "inject", k))
			rc = copy(inject_dir, sizeof(inject_dir), v, "inject=");
		else if (k == 4 && !strncmp(a, "root", k))
			rc = copy(root_dir, sizeof(root_dir), v, "root=");
		else if (k == 4 && !strncmp(a, "node", k))
			rc = copy(node_ep, sizeof(node_ep), v, "node=");
		else if (k == 6 && !strncmp(a, "shards", k)) {
			char *end;
			long n = strtol(v, &end, 10);
			if (*v == '\0' || *end != '\0' || n < 1 || n > 1000000) {
				slurm_error("colocate: plugstack.conf: shards=%s: expected the shards per GPU (a positive integer)", v);
				return -1;
			}
			rc = copy(shards, sizeof(shards), v, "shards=");
		} else if (k == 6 && !strncmp(a, "device", k)) {
			if (strcmp(v, "sim") && strcmp(v, "cuda")) {
				slurm_error("colocate: plugstack.conf: device=%s: use sim or cuda", v);
				return -1;
			}
			rc = copy(device, sizeof(device), v, "device=");
		} else if (k == 11 && !strncmp(a, "sim_gpu_mem", k)) {
			if (!is_size(v)) {
				slurm_error("colocate: plugstack.conf: sim_gpu_mem=%s: expected a size such as 16GiB", v);
				return -1;
			}
			rc = copy(sim_gpu_mem, sizeof(sim_gpu_mem), v, "sim_gpu_mem=");
		} else if (k == 8 && !strncmp(a, "opp_gres", k)) {
			rc = copy(opp_gres, sizeof(opp_gres), v, "opp_gres=");
		} else if (k == 7 && !strncmp(a, "enforce", k)) {
			if (strcmp(v, "shard") && strcmp(v, "all") && strcmp(v, "none")) {
				slurm_error("colocate: plugstack.conf: enforce=%s: use shard, all or none", v);
				return -1;
			}
			enforce = !strcmp(v, "none") ? 0 : !strcmp(v, "shard") ? 1 : 2;
		} else {
			slurm_error("colocate: plugstack.conf: unknown argument %s (known: inject= root= node= shards= "
				    "device= sim_gpu_mem= enforce= opp_gres=)", a);
			return -1;
		}
		if (rc)
			return rc;
	}
	if (!inject_dir[0] || !node_ep[0]) {
		slurm_error("colocate: plugstack.conf: inject= and node= are required (`colocate slurm config` prints the line)");
		return -1;
	}
	return 0;
}

int slurm_spank_init(spank_t sp, int ac, char **av)
{
	int i;
	if (site_args(ac, av))
		return -1;
	for (i = 0; options[i].name; i++)
		if (spank_option_register(sp, &options[i]) != ESPANK_SUCCESS) {
			slurm_error("colocate: cannot register option --%s", options[i].name);
			return -1;
		}
	return 0;
}

/* does a TRES list ("gres:colocate_opp:1,gres:gpu:1" or with "gres/") name GRES `name`? */
static int names_gres(const char *list, const char *name)
{
	const char *p = list;
	size_t n = strlen(name);
	while (p && *p) {
		const char *q = strstr(p, name);
		if (!q)
			return 0;
		if (q - list >= 5 && (!strncmp(q - 5, "gres:", 5) || !strncmp(q - 5, "gres/", 5)) &&
		    (q[n] == ':' || q[n] == ',' || q[n] == ';' || q[n] == '=' || q[n] == '\0'))
			return 1;
		p = q + n;
	}
	return 0;
}

/* once per step on each node, before the tasks start: a job that asked for the opportunistic GRES is an
 * opportunistic colocate job (its tasks inherit this). One slurmctld query, only when opp_gres= is set. */
int slurm_spank_user_init(spank_t sp, int ac, char **av)
{
	uint32_t job_id;
	job_info_msg_t *msg = NULL;
	uint32_t i;
	int found = 0;
	(void)ac;
	(void)av;
	if (!opp_gres[0] || asked || spank_get_item(sp, S_JOB_ID, &job_id) != ESPANK_SUCCESS)
		return 0;
	if (slurm_load_job(&msg, job_id, SHOW_DETAIL) != 0 || !msg) {
		slurm_error("colocate: cannot read job %u's GRES from slurmctld (opp_gres=%s)", job_id, opp_gres);
		return -1; /* fail closed: it may have asked for colocate */
	}
	for (i = 0; i < msg->record_count; i++) {
		slurm_job_info_t *j = &msg->job_array[i];
		if (names_gres(j->tres_per_node, opp_gres) || names_gres(j->tres_per_job, opp_gres) ||
		    names_gres(j->tres_per_task, opp_gres) || names_gres(j->tres_per_socket, opp_gres))
			found = 1;
	}
	slurm_free_job_info_msg(msg);
	if (found) {
		asked = 1;
		if (!strcmp(mode, "auto"))
			strcpy(mode, "opportunistic");
	}
	return 0;
}

static int set(spank_t sp, const char *name, const char *value)
{
	spank_err_t rc = spank_setenv(sp, name, value, 1);
	if (rc != ESPANK_SUCCESS) {
		slurm_error("colocate: cannot set %s: %s", name, spank_strerror(rc));
		return -1;
	}
	return 0;
}

/* ENDPOINT with each %n replaced by this node's name */
static int expand_node(spank_t sp, char *out, size_t size)
{
	char name[256] = "";
	const char *p = node_ep;
	size_t n = 0;
	if (strstr(node_ep, "%n") && spank_getenv(sp, "SLURMD_NODENAME", name, sizeof(name)) != ESPANK_SUCCESS) {
		slurm_error("colocate: node=%s names %%n but SLURMD_NODENAME is not set", node_ep);
		return -1;
	}
	while (*p) {
		const char *piece = p;
		size_t len = 1;
		if (p[0] == '%' && p[1] == 'n') {
			piece = name;
			len = strlen(name);
			p += 2;
		} else {
			p += 1;
		}
		if (n + len >= size) {
			slurm_error("colocate: node=%s is too long once expanded", node_ep);
			return -1;
		}
		memcpy(out + n, piece, len);
		n += len;
	}
	out[n] = '\0';
	return 0;
}

int slurm_spank_task_init(spank_t sp, int ac, char **av)
{
	char buf[64];
	char endpoint[MAXV];
	char path[3 * MAXV + 8];
	char old[MAXV] = "";
	int has_shards, has_gpus;
	(void)ac;
	(void)av;
	has_shards = spank_getenv(sp, "SLURM_SHARDS_ON_NODE", buf, sizeof(buf)) == ESPANK_SUCCESS && buf[0] && strcmp(buf, "0");
	has_gpus = has_shards || (spank_getenv(sp, "SLURM_STEP_GPUS", buf, sizeof(buf)) == ESPANK_SUCCESS && buf[0]) ||
		   (spank_getenv(sp, "SLURM_JOB_GPUS", buf, sizeof(buf)) == ESPANK_SUCCESS && buf[0]);
	if (!asked && !(enforce >= 1 && has_shards) && !(enforce >= 2 && has_gpus))
		return 0; /* not a colocate task: untouched */
	if (expand_node(sp, endpoint, sizeof(endpoint)))
		return -1;
	if (spank_getenv(sp, "PYTHONPATH", old, sizeof(old)) != ESPANK_SUCCESS)
		old[0] = '\0';
	snprintf(path, sizeof(path), "%s%s%s%s%s", inject_dir, root_dir[0] ? ":" : "", root_dir, old[0] ? ":" : "", old);
	if (set(sp, "COLOCATE_ENABLED", "1") || set(sp, "COLOCATE_ENGINE", "slurm") ||
	    set(sp, "COLOCATE_NODE", endpoint) || set(sp, "COLOCATE_NODE_REQUIRED", "1") ||
	    set(sp, "COLOCATE_SLURM", mode) || set(sp, "COLOCATE_DEVICE", device) || set(sp, "PYTHONPATH", path))
		return -1;
	if (shards[0] && set(sp, "COLOCATE_SLURM_SHARDS", shards))
		return -1;
	if (sim_gpu_mem[0] && set(sp, "COLOCATE_SIM_GPU_MEM", sim_gpu_mem))
		return -1;
	if (gpu_mem[0] && set(sp, "COLOCATE_GPU_MEM", gpu_mem))
		return -1;
	if (sm_share[0] && set(sp, "COLOCATE_SM_SHARE", sm_share))
		return -1;
	return 0;
}
