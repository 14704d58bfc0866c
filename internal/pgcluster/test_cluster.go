package pgcluster

import (
	"os"
	"path/filepath"
)

// TestDataDir returns the data directory of the cluster that this module's tests share:
// idemflow-test-pg under os.TempDir(). Package testdb starts it; the command pgtestctl
// stops it.
func TestDataDir() string {
	return filepath.Join(os.TempDir(), "idemflow-test-pg")
}

// TestClusterConfig returns the configuration of the cluster that this module's tests
// share: TestDataDir, with durability turned off (fsync, synchronous_commit,
// full_page_writes), which tests do not need and which costs them time. Benchmarks use a
// cluster of their own, configured like production.
func TestClusterConfig() *Config {
	return &Config{
		DataDir: TestDataDir(),
		Settings: map[string]string{
			"fsync":              "off",
			"synchronous_commit": "off",
			"full_page_writes":   "off",
		},
	}
}
