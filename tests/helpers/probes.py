"""Code for a probe process a test starts to measure itself."""

# peak_mb(): the probe's peak RSS in MB from its own mm's high-water mark. ru_maxrss carries the forking parent's peak
# over through vfork and exec (a busy pytest worker's 300 MB).
PEAK_MB = "def peak_mb():\n    return int(next(l for l in open('/proc/self/status') if l.startswith('VmHWM:')).split()[1]) // 1024\n"
