/*
 * nvml.c: the NVML entry points of the fake libnvidia-ml.so.1.
 *
 * The library replays a scenario file (see scenario.c and README.md) named
 * by $GPUHEALTH_FAKENVML_SCENARIO: devices, XID events, lost GPUs, NVLink
 * error counters and states, and fabric probe state, each at a time relative
 * to nvmlInit or at an absolute wall-clock time. Lines appended to the file
 * while the process runs are picked up (at most every 100 ms).
 *
 * Types are declared here with the layouts of NVIDIA's nvml.h (as vendored
 * by go-nvml v0.13.4-1) and checked by size below; no NVIDIA header is used.
 *
 * The Go package compiles every .c file of this directory through cgo with
 * FAKENVML_PARSER_ONLY defined: the test binary must not define nvml*
 * symbols itself, or go-nvml's calls would bind to them instead of to the
 * library under test.
 */
#ifndef FAKENVML_PARSER_ONLY

#include "scenario.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* ---- The NVML ABI subset (see nvml.h) ---- */

typedef int nvmlReturn_t;
enum {
	NVML_SUCCESS = 0,
	NVML_ERROR_UNINITIALIZED = 1,
	NVML_ERROR_INVALID_ARGUMENT = 2,
	NVML_ERROR_NOT_SUPPORTED = 3,
	NVML_ERROR_NOT_FOUND = 6,
	NVML_ERROR_INSUFFICIENT_SIZE = 7,
	NVML_ERROR_TIMEOUT = 10,
	NVML_ERROR_GPU_IS_LOST = 15,
	NVML_ERROR_MEMORY = 20,
	NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
	NVML_ERROR_UNKNOWN = 999,
};

typedef struct nvmlDevice_st *nvmlDevice_t;
typedef struct nvmlEventSet_st *nvmlEventSet_t;
typedef int nvmlEnableState_t;        /* NVML_FEATURE_DISABLED 0, ENABLED 1 */
typedef int nvmlNvLinkErrorCounter_t; /* NVML_NVLINK_ERROR_DL_REPLAY 0 .. DL_ECC_DATA 4 */

typedef struct {
	char busIdLegacy[16];
	unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
	char busId[32];
} nvmlPciInfo_t;

typedef struct {
	nvmlDevice_t device;
	unsigned long long eventType, eventData;
	unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

typedef struct {
	unsigned char clusterUuid[FAKE_CLUSTER_LEN];
	nvmlReturn_t status;
	unsigned int cliqueId;
	unsigned char state;
} nvmlGpuFabricInfo_t;

typedef struct {
	unsigned int version;
	unsigned char clusterUuid[FAKE_CLUSTER_LEN];
	nvmlReturn_t status;
	unsigned int cliqueId;
	unsigned char state;
	unsigned int healthMask;
} nvmlGpuFabricInfo_v2_t;

typedef struct {
	unsigned int version;
	unsigned char clusterUuid[FAKE_CLUSTER_LEN];
	nvmlReturn_t status;
	unsigned int cliqueId;
	unsigned char state;
	unsigned int healthMask;
	unsigned char healthSummary;
} nvmlGpuFabricInfo_v3_t, nvmlGpuFabricInfoV_t;

/* The sizes go-nvml's Go structs have (PciInfo, nvmlEventData, GpuFabricInfo*). */
_Static_assert(sizeof(nvmlPciInfo_t) == 68, "nvmlPciInfo_t layout");
_Static_assert(sizeof(nvmlEventData_t) == 32, "nvmlEventData_t layout");
_Static_assert(sizeof(nvmlGpuFabricInfo_t) == 28, "nvmlGpuFabricInfo_t layout");
_Static_assert(sizeof(nvmlGpuFabricInfo_v2_t) == 36, "nvmlGpuFabricInfo_v2_t layout");
_Static_assert(sizeof(nvmlGpuFabricInfo_v3_t) == 40, "nvmlGpuFabricInfo_v3_t layout");

#define STRUCT_VERSION(type, v) ((unsigned int)(sizeof(type) | ((unsigned int)(v) << 24)))

#define EVENT_SINGLE_BIT_ECC 0x1ULL
#define EVENT_DOUBLE_BIT_ECC 0x2ULL
#define EVENT_XID 0x8ULL
/* Registering for ECC events succeeds, but the fake never raises them. */
#define SUPPORTED_EVENTS (EVENT_SINGLE_BIT_ECC | EVENT_DOUBLE_BIT_ECC | EVENT_XID)

/* ---- State, all guarded by mu ---- */

#define ENV_SCENARIO "GPUHEALTH_FAKENVML_SCENARIO"
#define MAX_SETS 64                       /* one bit each in fake_op.delivered */
#define POLL_NS (100 * 1000000LL)         /* re-read the file at most this often */
#define SLEEP_NS (10 * 1000000LL)         /* granularity of nvmlEventSetWait */
#define MAX_FILE (16 << 20)               /* bytes read at nvmlInit */
#define MAX_CHUNK (1 << 20)               /* bytes read per poll afterwards */
#define PCI_DEVICE_ID 0x233510DEu         /* H200 SXM, vendor NVIDIA */

struct nvmlDevice_st {
	int index;
};

struct nvmlEventSet_st {
	int in_use;
	unsigned long long types[FAKE_MAX_DEVICES]; /* registered event types */
	int64_t xid_since[FAKE_MAX_DEVICES];        /* when XIDs were first registered */
};

static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static int refcount;               /* nvmlInit calls not yet shut down */
static struct fake_scenario sc;    /* valid while refcount > 0 */
static char path[4096];            /* the scenario file */
static off_t offset;               /* bytes of it parsed so far */
static int64_t init_ns;            /* wall clock at the first nvmlInit */
static int64_t next_poll;          /* monotonic time of the next re-read */
static int truncation_reported;
static struct nvmlDevice_st handles[FAKE_MAX_DEVICES];
static struct nvmlEventSet_st sets[MAX_SETS];

static int64_t now_ns(clockid_t clock)
{
	struct timespec ts;

	clock_gettime(clock, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* when is an op's wall-clock time. */
static int64_t when(const struct fake_op *op)
{
	return op->at.absolute ? op->at.ns : init_ns + op->at.ns;
}

/* load_locked reads the whole scenario file at nvmlInit. */
static nvmlReturn_t load_locked(void)
{
	const char *p = getenv(ENV_SCENARIO);
	struct stat st;
	size_t got = 0;
	char *buf;
	int fd;

	if (p == NULL || *p == '\0') {
		fprintf(stderr, "fakenvml: %s is not set; it must name a scenario file\n", ENV_SCENARIO);
		return NVML_ERROR_UNKNOWN;
	}
	if (strlen(p) >= sizeof(path)) {
		fprintf(stderr, "fakenvml: %s is too long\n", ENV_SCENARIO);
		return NVML_ERROR_UNKNOWN;
	}
	fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0 || fstat(fd, &st) != 0) {
		fprintf(stderr, "fakenvml: cannot read scenario %s: %s\n", p, strerror(errno));
		if (fd >= 0)
			close(fd);
		return NVML_ERROR_UNKNOWN;
	}
	if (st.st_size > MAX_FILE) {
		fprintf(stderr, "fakenvml: scenario %s is larger than %d bytes\n", p, MAX_FILE);
		close(fd);
		return NVML_ERROR_UNKNOWN;
	}
	buf = malloc((size_t)st.st_size + 1);
	while (buf != NULL && got < (size_t)st.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)st.st_size - got);

		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	if (buf == NULL) {
		fprintf(stderr, "fakenvml: out of memory reading %s\n", p);
		return NVML_ERROR_UNKNOWN;
	}
	strcpy(path, p);
	fake_scenario_free(&sc);
	sc.log = 1;
	fake_parse(&sc, buf, got, 1);
	sc.live = 1;
	free(buf);
	offset = (off_t)got;
	truncation_reported = 0;
	fprintf(stderr, "fakenvml: scenario %s: %d devices, %ld directives, %ld bad lines\n", path,
		sc.ndevices, sc.directives, sc.errors);
	return NVML_SUCCESS;
}

/* refresh_locked parses lines appended to the scenario since the last look. */
static void refresh_locked(void)
{
	int64_t now = now_ns(CLOCK_MONOTONIC);
	struct stat st;
	int fd;

	if (now < next_poll)
		return;
	next_poll = now + POLL_NS;
	fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return;
	if (fstat(fd, &st) == 0 && st.st_size > offset) {
		size_t want = (size_t)(st.st_size - offset);
		char *buf;
		ssize_t n;

		if (want > MAX_CHUNK)
			want = MAX_CHUNK;
		buf = malloc(want);
		if (buf != NULL && (n = pread(fd, buf, want, offset)) > 0)
			offset += (off_t)fake_parse(&sc, buf, (size_t)n, 0);
		free(buf);
	} else if (st.st_size < offset && !truncation_reported) {
		truncation_reported = 1;
		fprintf(stderr, "fakenvml: scenario %s shrank; only appends are read\n", path);
	}
	close(fd);
}

static int lost_locked(int dev, int64_t now)
{
	size_t k;

	for (k = 0; k < sc.nops; k++)
		if (sc.ops[k].kind == FAKE_OP_LOST && sc.ops[k].device == dev && when(&sc.ops[k]) <= now)
			return 1;
	return 0;
}

/* latest_locked returns the op of kind for dev/link that took effect last, or NULL. */
static const struct fake_op *latest_locked(int kind, int dev, int link, int64_t now)
{
	const struct fake_op *best = NULL;
	size_t k;

	for (k = 0; k < sc.nops; k++) {
		const struct fake_op *op = &sc.ops[k];

		if (op->kind == kind && op->device == dev && op->link == link && when(op) <= now &&
		    (best == NULL || when(op) >= when(best)))
			best = op;
	}
	return best;
}

/* counter_locked is the last value set plus what the ramps added since. */
static unsigned long long counter_locked(int dev, int link, int counter, int64_t now)
{
	int64_t base_t = INT64_MIN;
	uint64_t base = 0;
	double add = 0;
	size_t k;

	for (k = 0; k < sc.nops; k++) {
		const struct fake_op *op = &sc.ops[k];

		if (op->kind == FAKE_OP_COUNTER_SET && op->device == dev && op->link == link &&
		    op->counter == counter && when(op) <= now && when(op) >= base_t) {
			base_t = when(op);
			base = op->value;
		}
	}
	for (k = 0; k < sc.nops; k++) {
		const struct fake_op *op = &sc.ops[k];
		int64_t start = when(op), end = now;

		if (op->kind != FAKE_OP_COUNTER_RAMP || op->device != dev || op->link != link ||
		    op->counter != counter)
			continue;
		if (op->for_ns >= 0 && start + op->for_ns < end)
			end = start + op->for_ns;
		if (start < base_t)
			start = base_t;
		if (end > start)
			add += op->rate * (double)(end - start) / 1e9;
	}
	if (add >= 18446744073709551615.0 - (double)base)
		return UINT64_MAX;
	return base + (uint64_t)add;
}

/* device_locked resolves a handle; it fails when NVML is down or the GPU is lost. */
static nvmlReturn_t device_locked(nvmlDevice_t device, int *idx)
{
	uintptr_t off = (uintptr_t)device - (uintptr_t)handles;

	if (refcount == 0)
		return NVML_ERROR_UNINITIALIZED;
	refresh_locked();
	if (device == NULL || off % sizeof(handles[0]) != 0 || off / sizeof(handles[0]) >= (uintptr_t)sc.ndevices)
		return NVML_ERROR_INVALID_ARGUMENT;
	*idx = (int)(off / sizeof(handles[0]));
	return lost_locked(*idx, now_ns(CLOCK_REALTIME)) ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

static struct nvmlEventSet_st *set_locked(nvmlEventSet_t set)
{
	uintptr_t off = (uintptr_t)set - (uintptr_t)sets;

	if (set == NULL || off % sizeof(sets[0]) != 0 || off / sizeof(sets[0]) >= MAX_SETS ||
	    !set->in_use)
		return NULL;
	return set;
}

/* handle_locked hands out device i, or says it is lost. */
static nvmlReturn_t handle_locked(int i, nvmlDevice_t *device)
{
	*device = &handles[i];
	return lost_locked(i, now_ns(CLOCK_REALTIME)) ? NVML_ERROR_GPU_IS_LOST : NVML_SUCCESS;
}

static nvmlReturn_t copy_string(char *dst, unsigned int length, const char *src)
{
	size_t n = strlen(src);

	if (length < n + 1)
		return NVML_ERROR_INSUFFICIENT_SIZE;
	memcpy(dst, src, n + 1);
	return NVML_SUCCESS;
}

/* ---- Initialisation ---- */

static nvmlReturn_t init(void)
{
	nvmlReturn_t r = NVML_SUCCESS;
	int i;

	pthread_mutex_lock(&mu);
	if (refcount == 0) {
		r = load_locked();
		if (r == NVML_SUCCESS) {
			init_ns = now_ns(CLOCK_REALTIME);
			next_poll = now_ns(CLOCK_MONOTONIC) + POLL_NS;
			memset(sets, 0, sizeof(sets));
			for (i = 0; i < FAKE_MAX_DEVICES; i++)
				handles[i].index = i;
		}
	}
	if (r == NVML_SUCCESS)
		refcount++;
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlInit_v2(void) { return init(); }
nvmlReturn_t nvmlInit(void) { return init(); }
nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return init(); }

nvmlReturn_t nvmlShutdown(void)
{
	nvmlReturn_t r = NVML_SUCCESS;

	pthread_mutex_lock(&mu);
	if (refcount == 0)
		r = NVML_ERROR_UNINITIALIZED;
	else if (--refcount == 0) {
		fake_scenario_free(&sc);
		memset(sets, 0, sizeof(sets));
	}
	pthread_mutex_unlock(&mu);
	return r;
}

const char *nvmlErrorString(nvmlReturn_t result)
{
	switch (result) {
	case NVML_SUCCESS: return "Success";
	case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
	case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
	case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
	case NVML_ERROR_NOT_FOUND: return "Not Found";
	case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
	case NVML_ERROR_TIMEOUT: return "Timeout";
	case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
	case NVML_ERROR_MEMORY: return "Insufficient Memory";
	case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
	case NVML_ERROR_UNKNOWN: return "Unknown Error";
	default: return "Unknown Error (fakenvml does not name this code)";
	}
}

nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
	nvmlReturn_t r;

	if (version == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	r = refcount == 0 ? NVML_ERROR_UNINITIALIZED : copy_string(version, length, sc.driver);
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
	nvmlReturn_t r = NVML_SUCCESS;

	if (cudaDriverVersion == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if (refcount == 0)
		r = NVML_ERROR_UNINITIALIZED;
	else
		*cudaDriverVersion = (int)sc.cuda;
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
	return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length)
{
	if (version == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	return copy_string(version, length, "12.570.133.20");
}

/* ---- Devices ---- */

nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count)
{
	nvmlReturn_t r = NVML_SUCCESS;

	if (count == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if (refcount == 0)
		r = NVML_ERROR_UNINITIALIZED;
	else
		*count = (unsigned int)sc.ndevices;
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
	nvmlReturn_t r;

	if (device == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if (refcount == 0) {
		r = NVML_ERROR_UNINITIALIZED;
	} else {
		refresh_locked();
		r = index < (unsigned int)sc.ndevices ? handle_locked((int)index, device)
						      : NVML_ERROR_INVALID_ARGUMENT;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
	nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
	int i;

	if (uuid == NULL || device == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if (refcount == 0)
		r = NVML_ERROR_UNINITIALIZED;
	else
		refresh_locked();
	for (i = 0; refcount > 0 && i < sc.ndevices; i++)
		if (strncmp(uuid, sc.devices[i].uuid, FAKE_UUID_SIZE) == 0)
			r = handle_locked(i, device);
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId, nvmlDevice_t *device)
{
	nvmlReturn_t r = NVML_ERROR_NOT_FOUND;
	unsigned dom, bus, dev, fn;
	int i;

	if (pciBusId == NULL || device == NULL ||
	    fake_parse_pci(pciBusId, strnlen(pciBusId, 64), &dom, &bus, &dev, &fn) != 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if (refcount == 0)
		r = NVML_ERROR_UNINITIALIZED;
	for (i = 0; refcount > 0 && i < sc.ndevices; i++) {
		const struct fake_device *d = &sc.devices[i];

		if (d->domain == dom && d->bus == bus && d->dev == dev && d->function == fn)
			r = handle_locked(i, device);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
	nvmlReturn_t r;
	int i;

	if (uuid == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) == NVML_SUCCESS)
		r = copy_string(uuid, length, sc.devices[i].uuid);
	pthread_mutex_unlock(&mu);
	return r;
}

/* device_string copies one of device's inventory strings. */
static nvmlReturn_t device_string(nvmlDevice_t device, char *dst, unsigned int length, size_t field)
{
	nvmlReturn_t r;
	int i;

	if (dst == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) == NVML_SUCCESS)
		r = copy_string(dst, length, (const char *)&sc.devices[i] + field);
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t device, char *version, unsigned int length)
{
	return device_string(device, version, length, offsetof(struct fake_device, vbios));
}

nvmlReturn_t nvmlDeviceGetInforomImageVersion(nvmlDevice_t device, char *version, unsigned int length)
{
	return device_string(device, version, length, offsetof(struct fake_device, inforom));
}

/* device_mode reads one of device's modes; -1 in the scenario is "not supported". */
static nvmlReturn_t device_mode(nvmlDevice_t device, size_t field, int *mode)
{
	nvmlReturn_t r;
	int i;

	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) == NVML_SUCCESS) {
		*mode = *(const int *)((const char *)&sc.devices[i] + field);
		if (*mode < 0)
			r = NVML_ERROR_NOT_SUPPORTED;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t device, nvmlEnableState_t *current, nvmlEnableState_t *pending)
{
	int m;
	nvmlReturn_t r;

	if (current == NULL || pending == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((r = device_mode(device, offsetof(struct fake_device, ecc), &m)) == NVML_SUCCESS)
		*current = *pending = m;
	return r;
}

nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t device, nvmlEnableState_t *mode)
{
	int m;
	nvmlReturn_t r;

	if (mode == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((r = device_mode(device, offsetof(struct fake_device, persistence), &m)) == NVML_SUCCESS)
		*mode = m;
	return r;
}

nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode, unsigned int *pendingMode)
{
	int m;
	nvmlReturn_t r;

	if (currentMode == NULL || pendingMode == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((r = device_mode(device, offsetof(struct fake_device, mig), &m)) == NVML_SUCCESS)
		*currentMode = *pendingMode = (unsigned)m;
	return r;
}

nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t device, unsigned int *limit)
{
	nvmlReturn_t r;
	int i;

	if (limit == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) == NVML_SUCCESS)
		*limit = sc.devices[i].power_w * 1000; /* milliwatts */
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
	nvmlReturn_t r;
	int i;

	if (name == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) == NVML_SUCCESS)
		r = copy_string(name, length, sc.devices[i].name);
	pthread_mutex_unlock(&mu);
	return r;
}

static nvmlReturn_t get_index(nvmlDevice_t device, unsigned int *index)
{
	nvmlReturn_t r;
	int i;

	if (index == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) == NVML_SUCCESS)
		*index = (unsigned int)i;
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
	return get_index(device, index);
}

/* nvmlDeviceGetMinorNumber: /dev/nvidia<minor>; the fake uses the index. */
nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
	return get_index(device, minorNumber);
}

nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
	nvmlReturn_t r;
	int i;

	if (pci == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) == NVML_SUCCESS) {
		const struct fake_device *d = &sc.devices[i];

		memset(pci, 0, sizeof(*pci));
		pci->domain = d->domain;
		pci->bus = d->bus;
		pci->device = d->dev;
		pci->pciDeviceId = PCI_DEVICE_ID;
		snprintf(pci->busIdLegacy, sizeof(pci->busIdLegacy), "%04X:%02X:%02X.%u",
			 d->domain & 0xffff, d->bus & 0xff, d->dev & 0x1f, d->function & 7);
		snprintf(pci->busId, sizeof(pci->busId), "%08X:%02X:%02X.%u", d->domain,
			 d->bus & 0xff, d->dev & 0x1f, d->function & 7);
	}
	pthread_mutex_unlock(&mu);
	return r;
}

/* ---- Events ---- */

nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device, unsigned long long *eventTypes)
{
	nvmlReturn_t r;
	int i;

	if (eventTypes == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) == NVML_SUCCESS)
		*eventTypes = SUPPORTED_EVENTS;
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
	nvmlReturn_t r = NVML_ERROR_MEMORY;
	size_t s, k;

	if (set == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if (refcount == 0)
		r = NVML_ERROR_UNINITIALIZED;
	for (s = 0; refcount > 0 && s < MAX_SETS; s++) {
		if (sets[s].in_use)
			continue;
		memset(&sets[s], 0, sizeof(sets[s]));
		sets[s].in_use = 1;
		for (k = 0; k < sc.nops; k++)
			sc.ops[k].delivered &= ~(1ULL << s);
		*set = &sets[s];
		r = NVML_SUCCESS;
		break;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
	nvmlReturn_t r = NVML_SUCCESS;
	struct nvmlEventSet_st *es;

	pthread_mutex_lock(&mu);
	if (refcount == 0)
		r = NVML_ERROR_UNINITIALIZED;
	else if ((es = set_locked(set)) == NULL)
		r = NVML_ERROR_INVALID_ARGUMENT;
	else
		es->in_use = 0;
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set)
{
	struct nvmlEventSet_st *es;
	nvmlReturn_t r;
	int i;

	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) != NVML_SUCCESS)
		goto out;
	if ((es = set_locked(set)) == NULL) {
		r = NVML_ERROR_INVALID_ARGUMENT;
		goto out;
	}
	if (eventTypes & ~SUPPORTED_EVENTS) {
		r = NVML_ERROR_NOT_SUPPORTED;
		goto out;
	}
	es->types[i] |= eventTypes;
	if ((eventTypes & EVENT_XID) && es->xid_since[i] == 0)
		es->xid_since[i] = now_ns(CLOCK_REALTIME);
out:
	pthread_mutex_unlock(&mu);
	return r;
}

/*
 * wait_step_locked hands out the earliest XID due and not yet given to this
 * set, then reports a lost GPU; NVML_ERROR_TIMEOUT means "nothing yet".
 * Like real NVML, a set only sees XIDs raised after it registered for them,
 * so an XID timed before nvmlInit (or before registration) never arrives.
 */
static nvmlReturn_t wait_step_locked(nvmlEventSet_t set, nvmlEventData_t *data)
{
	struct nvmlEventSet_st *es;
	struct fake_op *best = NULL;
	int64_t now, best_t = 0;
	unsigned slot;
	size_t k;
	int d;

	if (refcount == 0)
		return NVML_ERROR_UNINITIALIZED;
	if ((es = set_locked(set)) == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	refresh_locked();
	now = now_ns(CLOCK_REALTIME);
	slot = (unsigned)(es - sets);
	for (k = 0; k < sc.nops; k++) {
		struct fake_op *op = &sc.ops[k];
		int64_t t = when(op);

		if (op->kind != FAKE_OP_XID || !(es->types[op->device] & EVENT_XID) || t > now ||
		    t < init_ns || t < es->xid_since[op->device] || (op->delivered >> slot & 1))
			continue;
		if (best == NULL || t < best_t) {
			best = op;
			best_t = t;
		}
	}
	if (best != NULL) {
		best->delivered |= 1ULL << slot;
		memset(data, 0, sizeof(*data));
		data->device = &handles[best->device];
		data->eventType = EVENT_XID;
		data->eventData = best->value;
		data->gpuInstanceId = 0xFFFFFFFFu;
		data->computeInstanceId = 0xFFFFFFFFu;
		return NVML_SUCCESS;
	}
	for (d = 0; d < sc.ndevices; d++)
		if (es->types[d] != 0 && lost_locked(d, now))
			return NVML_ERROR_GPU_IS_LOST;
	return NVML_ERROR_TIMEOUT;
}

nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms)
{
	int64_t deadline = now_ns(CLOCK_MONOTONIC) + (int64_t)timeoutms * 1000000LL;

	if (data == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	for (;;) {
		struct timespec ts;
		nvmlReturn_t r;
		int64_t left;

		pthread_mutex_lock(&mu);
		r = wait_step_locked(set, data);
		pthread_mutex_unlock(&mu);
		left = deadline - now_ns(CLOCK_MONOTONIC);
		if (r != NVML_ERROR_TIMEOUT || left <= 0)
			return r;
		if (left > SLEEP_NS)
			left = SLEEP_NS;
		ts.tv_sec = 0;
		ts.tv_nsec = (long)left;
		nanosleep(&ts, NULL);
	}
}

/* ---- NVLink ---- */

/* nvlink_locked checks device and link; a GPU without NVLinks is NOT_SUPPORTED. */
static nvmlReturn_t nvlink_locked(nvmlDevice_t device, unsigned int link, int *idx)
{
	nvmlReturn_t r = device_locked(device, idx);

	if (r != NVML_SUCCESS)
		return r;
	if (sc.devices[*idx].links == 0)
		return NVML_ERROR_NOT_SUPPORTED;
	if (link >= sc.devices[*idx].links)
		return NVML_ERROR_INVALID_ARGUMENT;
	return NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive)
{
	nvmlReturn_t r;
	int i;

	if (isActive == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = nvlink_locked(device, link, &i)) == NVML_SUCCESS) {
		const struct fake_op *op = latest_locked(FAKE_OP_LINKSTATE, i, (int)link, now_ns(CLOCK_REALTIME));

		*isActive = op == NULL || op->state;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t device, unsigned int link,
					     nvmlNvLinkErrorCounter_t counter, unsigned long long *counterValue)
{
	nvmlReturn_t r;
	int i;

	if (counterValue == NULL || counter < 0 || counter >= FAKE_NUM_COUNTERS)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = nvlink_locked(device, link, &i)) == NVML_SUCCESS)
		*counterValue = counter_locked(i, (int)link, counter, now_ns(CLOCK_REALTIME));
	pthread_mutex_unlock(&mu);
	return r;
}

/* nvmlDeviceResetNvLinkErrorCounters sets all five counters of the link to 0 now. */
nvmlReturn_t nvmlDeviceResetNvLinkErrorCounters(nvmlDevice_t device, unsigned int link)
{
	int64_t now = now_ns(CLOCK_REALTIME);
	nvmlReturn_t r;
	int i, c;

	pthread_mutex_lock(&mu);
	r = nvlink_locked(device, link, &i);
	for (c = 0; r == NVML_SUCCESS && c < FAKE_NUM_COUNTERS; c++) {
		struct fake_op *op = fake_add_op(&sc);

		if (op == NULL) {
			r = NVML_ERROR_MEMORY;
			break;
		}
		op->kind = FAKE_OP_COUNTER_SET;
		op->device = i;
		op->link = (int)link;
		op->counter = c;
		op->at.absolute = 1;
		op->at.ns = now;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

/* ---- Fabric ---- */

/* fabric_locked finds the fabric state in effect; none means NOT_SUPPORTED. */
static nvmlReturn_t fabric_locked(nvmlDevice_t device, const struct fake_op **op)
{
	nvmlReturn_t r;
	int i;

	if ((r = device_locked(device, &i)) != NVML_SUCCESS)
		return r;
	*op = latest_locked(FAKE_OP_FABRIC, i, 0, now_ns(CLOCK_REALTIME));
	return *op == NULL ? NVML_ERROR_NOT_SUPPORTED : NVML_SUCCESS;
}

nvmlReturn_t nvmlDeviceGetGpuFabricInfo(nvmlDevice_t device, nvmlGpuFabricInfo_t *info)
{
	const struct fake_op *op;
	nvmlReturn_t r;

	if (info == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = fabric_locked(device, &op)) == NVML_SUCCESS) {
		memset(info, 0, sizeof(*info));
		memcpy(info->clusterUuid, op->cluster, FAKE_CLUSTER_LEN);
		info->status = (nvmlReturn_t)op->status;
		info->cliqueId = op->clique;
		info->state = (unsigned char)op->state;
	}
	pthread_mutex_unlock(&mu);
	return r;
}

/* nvmlDeviceGetGpuFabricInfoV fills a v2 or a v3 struct, as its version says. */
nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, nvmlGpuFabricInfoV_t *info)
{
	const struct fake_op *op;
	unsigned int version;
	nvmlReturn_t r;

	if (info == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	version = info->version;
	if (version != STRUCT_VERSION(nvmlGpuFabricInfo_v2_t, 2) &&
	    version != STRUCT_VERSION(nvmlGpuFabricInfo_v3_t, 3))
		return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
	pthread_mutex_lock(&mu);
	if ((r = fabric_locked(device, &op)) == NVML_SUCCESS) {
		nvmlGpuFabricInfo_v3_t out;

		/* v2 is v3 without its last field: copy only what the caller has. */
		memset(&out, 0, sizeof(out));
		out.version = version;
		memcpy(out.clusterUuid, op->cluster, FAKE_CLUSTER_LEN);
		out.status = (nvmlReturn_t)op->status;
		out.cliqueId = op->clique;
		out.state = (unsigned char)op->state;
		out.healthMask = op->mask;
		out.healthSummary = (unsigned char)op->health;
		memcpy(info, &out, version == STRUCT_VERSION(nvmlGpuFabricInfo_v2_t, 2)
					   ? sizeof(nvmlGpuFabricInfo_v2_t) : sizeof(out));
	}
	pthread_mutex_unlock(&mu);
	return r;
}

/* ---- Performance and memory health ---- */

typedef struct {
	unsigned long long referenceTime; /* CPU timestamp, microseconds */
	unsigned long long violationTime; /* nanoseconds */
} nvmlViolationTime_t;

typedef struct {
	unsigned int gpu, memory;
} nvmlUtilization_t;

typedef struct {
	unsigned int fieldId, scopeId;
	long long timestamp, latencyUsec;
	unsigned int valueType; /* nvmlValueType_t */
	nvmlReturn_t nvmlReturn;
	union {
		double dVal;
		unsigned int uiVal;
		unsigned long ulVal;
		unsigned long long ullVal;
		signed long long sllVal;
	} value;
} nvmlFieldValue_t;

_Static_assert(sizeof(nvmlViolationTime_t) == 16, "nvmlViolationTime_t layout");
_Static_assert(sizeof(nvmlUtilization_t) == 8, "nvmlUtilization_t layout");
_Static_assert(sizeof(nvmlFieldValue_t) == 40, "nvmlFieldValue_t layout");

#define CLOCK_GRAPHICS 0
#define CLOCK_SM 1
#define TEMPERATURE_GPU 0
#define TEMPERATURE_THRESHOLD_SHUTDOWN 0
#define TEMPERATURE_THRESHOLD_SLOWDOWN 1
#define MEMORY_ERROR_TYPE_UNCORRECTED 1
#define FI_DEV_NVLINK_SPEED_MBPS_L0 84
#define FI_DEV_NVLINK_SPEED_MBPS_L5 89
#define FI_DEV_NVLINK_SPEED_MBPS_L6 132
#define FI_DEV_NVLINK_SPEED_MBPS_L11 137
#define FI_DEV_NVLINK_GET_SPEED 164
#define VALUE_TYPE_UNSIGNED_INT 1
#define DEFAULT_NVLINK_MBPS 26562 /* what an H100's NVLink 4 link reports */

/*
 * The clocks event reasons behind each nvmlPerfPolicyType_t (POWER 0,
 * THERMAL 1, SYNC_BOOST 2, BOARD_LIMIT 3, LOW_UTILIZATION 4, RELIABILITY 5):
 * a policy's violation time grows while one of its reasons is active.
 */
static const unsigned long long policy_reasons[] = {
	0x4 | 0x80, /* SW power cap, HW power brake */
	0x20 | 0x40, /* SW and HW thermal slowdown */
	0x10,       /* sync boost */
	0x200,      /* board limit */
	0x1,        /* GPU idle */
	0x400,      /* reliability */
};

/* has_locked says whether the scenario has any line of kind for dev (any link when link < 0). */
static int has_locked(int kind, int dev, int link)
{
	size_t k;

	for (k = 0; k < sc.nops; k++)
		if (sc.ops[k].kind == kind && sc.ops[k].device == dev && (link < 0 || sc.ops[k].link == link))
			return 1;
	return 0;
}

/*
 * group_locked resolves the device and the state of one signal group in
 * effect now. A device with no line of the group does not support it
 * (NOT_SUPPORTED, as a GPU or driver without the feature answers); before
 * the first line takes effect the group has its defaults.
 */
static nvmlReturn_t group_locked(nvmlDevice_t device, int kind, int link, struct fake_op *out, int *idx)
{
	const struct fake_op *op;
	nvmlReturn_t r = device_locked(device, idx);

	if (r != NVML_SUCCESS)
		return r;
	if (!has_locked(kind, *idx, kind == FAKE_OP_NVLINK_SPEED ? -1 : link))
		return NVML_ERROR_NOT_SUPPORTED;
	op = latest_locked(kind, *idx, link, now_ns(CLOCK_REALTIME));
	if (op != NULL) {
		*out = *op;
		return NVML_SUCCESS;
	}
	memset(out, 0, sizeof(*out));
	switch (kind) {
	case FAKE_OP_CLOCKS:
		out->num[FAKE_SM] = out->num[FAKE_SM_MAX] = 1980;
		break;
	case FAKE_OP_PCIE:
		out->num[FAKE_GEN] = out->num[FAKE_MAX_GEN] = out->num[FAKE_GPU_MAX_GEN] = 5;
		out->num[FAKE_WIDTH] = out->num[FAKE_MAX_WIDTH] = 16;
		break;
	case FAKE_OP_TEMP:
		out->num[FAKE_TEMP_GPU] = 40;
		out->num[FAKE_SLOWDOWN] = 90;
		out->num[FAKE_SHUTDOWN] = 95;
		break;
	case FAKE_OP_NVLINK_SPEED:
		out->num[FAKE_MBPS] = DEFAULT_NVLINK_MBPS;
		break;
	}
	return NVML_SUCCESS;
}

static nvmlReturn_t clocks_reasons(nvmlDevice_t device, unsigned long long *reasons)
{
	struct fake_op op;
	nvmlReturn_t r;
	int i;

	if (reasons == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = group_locked(device, FAKE_OP_CLOCKS, 0, &op, &i)) == NVML_SUCCESS)
		*reasons = op.value;
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device, unsigned long long *reasons)
{
	return clocks_reasons(device, reasons);
}

/* The name drivers before 535 export. */
nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device, unsigned long long *reasons)
{
	return clocks_reasons(device, reasons);
}

static nvmlReturn_t clock_info(nvmlDevice_t device, int type, unsigned int *clock, int max)
{
	struct fake_op op;
	nvmlReturn_t r;
	int i;

	if (clock == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (type != CLOCK_SM && type != CLOCK_GRAPHICS)
		return NVML_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&mu);
	if ((r = group_locked(device, FAKE_OP_CLOCKS, 0, &op, &i)) == NVML_SUCCESS)
		*clock = op.num[max ? FAKE_SM_MAX : FAKE_SM];
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
	return clock_info(device, type, clock, 0);
}

nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, int type, unsigned int *clock)
{
	return clock_info(device, type, clock, 1);
}

static int by_time(const void *a, const void *b)
{
	const struct fake_op *x = *(const struct fake_op *const *)a, *y = *(const struct fake_op *const *)b;

	if (when(x) != when(y))
		return when(x) < when(y) ? -1 : 1;
	return x < y ? -1 : x > y; /* file order among equal times: the later line wins */
}

/* nvmlDeviceGetViolationStatus integrates the clocks lines: the time, since
 * the first of them, during which one of the policy's reasons was active. */
nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, int policy, nvmlViolationTime_t *out)
{
	const struct fake_op **line = NULL;
	int64_t now = now_ns(CLOCK_REALTIME);
	unsigned long long total = 0;
	struct fake_op op;
	size_t k, n = 0;
	nvmlReturn_t r;
	int i;

	if (out == NULL || policy < 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((size_t)policy >= sizeof(policy_reasons) / sizeof(policy_reasons[0]))
		return NVML_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&mu);
	r = group_locked(device, FAKE_OP_CLOCKS, 0, &op, &i);
	if (r == NVML_SUCCESS && (line = malloc(sc.nops * sizeof(*line) + 1)) == NULL)
		r = NVML_ERROR_MEMORY;
	if (r == NVML_SUCCESS) {
		for (k = 0; k < sc.nops; k++)
			if (sc.ops[k].kind == FAKE_OP_CLOCKS && sc.ops[k].device == i && when(&sc.ops[k]) <= now)
				line[n++] = &sc.ops[k];
		qsort(line, n, sizeof(*line), by_time);
		for (k = 0; k < n; k++) {
			int64_t end = k + 1 < n ? when(line[k + 1]) : now;

			if (line[k]->value & policy_reasons[policy])
				total += (unsigned long long)(end - when(line[k]));
		}
		out->referenceTime = (unsigned long long)(now / 1000);
		out->violationTime = total;
	}
	free(line);
	pthread_mutex_unlock(&mu);
	return r;
}

/* pcie_value reads one number of the pcie group. */
static nvmlReturn_t pcie_value(nvmlDevice_t device, int which, unsigned int *value)
{
	struct fake_op op;
	nvmlReturn_t r;
	int i;

	if (value == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = group_locked(device, FAKE_OP_PCIE, 0, &op, &i)) == NVML_SUCCESS)
		*value = op.num[which];
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
	return pcie_value(device, FAKE_GEN, gen);
}

nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
	return pcie_value(device, FAKE_WIDTH, width);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
	return pcie_value(device, FAKE_MAX_GEN, gen);
}

nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t device, unsigned int *width)
{
	return pcie_value(device, FAKE_MAX_WIDTH, width);
}

nvmlReturn_t nvmlDeviceGetGpuMaxPcieLinkGeneration(nvmlDevice_t device, unsigned int *gen)
{
	return pcie_value(device, FAKE_GPU_MAX_GEN, gen);
}

/* A counter on a pseudo link: supported when the device has a line of
 * kind (or of the counter itself). */
static nvmlReturn_t pseudo_counter(nvmlDevice_t device, int kind, int link, unsigned long long *value)
{
	nvmlReturn_t r;
	int i;

	pthread_mutex_lock(&mu);
	if ((r = device_locked(device, &i)) == NVML_SUCCESS) {
		if ((kind < 0 || !has_locked(kind, i, -1)) && !has_locked(FAKE_OP_COUNTER_SET, i, link) &&
		    !has_locked(FAKE_OP_COUNTER_RAMP, i, link))
			r = NVML_ERROR_NOT_SUPPORTED;
		else
			*value = counter_locked(i, link, 0, now_ns(CLOCK_REALTIME));
	}
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t device, unsigned int *value)
{
	unsigned long long v = 0;
	nvmlReturn_t r;

	if (value == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if ((r = pseudo_counter(device, FAKE_OP_PCIE, FAKE_LINK_PCIE_REPLAY, &v)) == NVML_SUCCESS)
		*value = (unsigned int)v;
	return r;
}

nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t device, int errorType, int counterType,
					 unsigned long long *eccCounts)
{
	nvmlReturn_t r;

	if (eccCounts == NULL || errorType < 0 || errorType > 1 || counterType < 0 || counterType > 1)
		return NVML_ERROR_INVALID_ARGUMENT;
	r = pseudo_counter(device, -1, FAKE_LINK_ECC, eccCounts);
	if (r == NVML_SUCCESS && errorType != MEMORY_ERROR_TYPE_UNCORRECTED)
		*eccCounts = 0; /* the fake models uncorrected errors only */
	return r;
}

nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, nvmlUtilization_t *utilization)
{
	struct fake_op op;
	nvmlReturn_t r;
	int i;

	if (utilization == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = group_locked(device, FAKE_OP_UTIL, 0, &op, &i)) == NVML_SUCCESS) {
		utilization->gpu = op.num[FAKE_UTIL_GPU];
		utilization->memory = op.num[FAKE_UTIL_MEMORY];
	}
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t device, unsigned int *corrRows, unsigned int *uncRows,
				       unsigned int *isPending, unsigned int *failureOccurred)
{
	struct fake_op op;
	nvmlReturn_t r;
	int i;

	if (corrRows == NULL || uncRows == NULL || isPending == NULL || failureOccurred == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = group_locked(device, FAKE_OP_REMAP, 0, &op, &i)) == NVML_SUCCESS) {
		*corrRows = op.num[FAKE_CORR];
		*uncRows = op.num[FAKE_UNCORR];
		*isPending = op.num[FAKE_PENDING];
		*failureOccurred = op.num[FAKE_FAILURE];
	}
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t device, nvmlEnableState_t *isPending)
{
	struct fake_op op;
	nvmlReturn_t r;
	int i;

	if (isPending == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = group_locked(device, FAKE_OP_RETIRED, 0, &op, &i)) == NVML_SUCCESS)
		*isPending = op.state;
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, int sensor, unsigned int *temp)
{
	struct fake_op op;
	nvmlReturn_t r;
	int i;

	if (temp == NULL || sensor != TEMPERATURE_GPU)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	if ((r = group_locked(device, FAKE_OP_TEMP, 0, &op, &i)) == NVML_SUCCESS)
		*temp = op.num[FAKE_TEMP_GPU];
	pthread_mutex_unlock(&mu);
	return r;
}

nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t device, int threshold, unsigned int *temp)
{
	struct fake_op op;
	nvmlReturn_t r;
	int i;

	if (temp == NULL)
		return NVML_ERROR_INVALID_ARGUMENT;
	if (threshold != TEMPERATURE_THRESHOLD_SHUTDOWN && threshold != TEMPERATURE_THRESHOLD_SLOWDOWN)
		return NVML_ERROR_NOT_SUPPORTED;
	pthread_mutex_lock(&mu);
	if ((r = group_locked(device, FAKE_OP_TEMP, 0, &op, &i)) == NVML_SUCCESS)
		*temp = op.num[threshold == TEMPERATURE_THRESHOLD_SLOWDOWN ? FAKE_SLOWDOWN : FAKE_SHUTDOWN];
	pthread_mutex_unlock(&mu);
	return r;
}

/* nvmlDeviceGetFieldValues answers the NVLink speed fields (the scoped
 * FI_DEV_NVLINK_GET_SPEED and the per-link FI_DEV_NVLINK_SPEED_MBPS_L0..L11);
 * every other field is NOT_SUPPORTED in its own nvmlReturn. */
nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t device, int valuesCount, nvmlFieldValue_t *values)
{
	int64_t now = now_ns(CLOCK_REALTIME);
	nvmlReturn_t r;
	int i, v;

	if (values == NULL || valuesCount <= 0)
		return NVML_ERROR_INVALID_ARGUMENT;
	pthread_mutex_lock(&mu);
	r = device_locked(device, &i);
	for (v = 0; r == NVML_SUCCESS && v < valuesCount; v++) {
		nvmlFieldValue_t *f = &values[v];
		unsigned int id = f->fieldId;
		long link = -1;
		struct fake_op op;
		int j;

		f->timestamp = now / 1000;
		f->latencyUsec = 0;
		f->valueType = VALUE_TYPE_UNSIGNED_INT;
		memset(&f->value, 0, sizeof(f->value));
		if (id == FI_DEV_NVLINK_GET_SPEED)
			link = (long)f->scopeId;
		else if (id >= FI_DEV_NVLINK_SPEED_MBPS_L0 && id <= FI_DEV_NVLINK_SPEED_MBPS_L5)
			link = (long)(id - FI_DEV_NVLINK_SPEED_MBPS_L0);
		else if (id >= FI_DEV_NVLINK_SPEED_MBPS_L6 && id <= FI_DEV_NVLINK_SPEED_MBPS_L11)
			link = (long)(id - FI_DEV_NVLINK_SPEED_MBPS_L6) + 6;
		if (link < 0) {
			f->nvmlReturn = NVML_ERROR_NOT_SUPPORTED;
			continue;
		}
		if ((unsigned long)link >= sc.devices[i].links) {
			f->nvmlReturn = sc.devices[i].links == 0 ? NVML_ERROR_NOT_SUPPORTED : NVML_ERROR_INVALID_ARGUMENT;
			continue;
		}
		f->nvmlReturn = group_locked(device, FAKE_OP_NVLINK_SPEED, (int)link, &op, &j);
		if (f->nvmlReturn == NVML_SUCCESS)
			f->value.uiVal = op.num[FAKE_MBPS];
	}
	pthread_mutex_unlock(&mu);
	return r;
}

#endif /* FAKENVML_PARSER_ONLY */
