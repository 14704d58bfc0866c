// Package pgcluster runs a private PostgreSQL cluster from the server binaries installed
// on the machine, for tests and for the demo server.
//
// # Starting and reusing
//
// Ensure initialises a data directory with initdb when it is empty, starts the server
// with pg_ctl, and returns a Cluster that gives URLs for its databases. When a server
// already runs on the directory, Ensure reuses it: a cluster left running by an earlier
// process, even one that was killed, is never started twice. Several processes may call
// Ensure on the same directory at once (go test runs packages as parallel processes):
// they serialise on an flock held on a lock file beside the data directory, and when the
// server already answers, Ensure returns after one connection, without running any
// PostgreSQL binary.
//
// The server listens on 127.0.0.1 only, on a free TCP port chosen at the first start
// and kept in a file in the data directory, with Unix-domain sockets disabled. The
// superuser is "postgres" with trust authentication: a cluster is for one machine's
// tests and demos, never for data that matters. The server runs in its own session and
// logs to server.log in the data directory, so it survives the process that started it
// and holds none of its pipes.
//
// # Running as root
//
// initdb and the server refuse to run as root. When the process runs as root,
// pgcluster runs them as the user "nobody" and gives it the data directory; every
// parent of the data directory must then be searchable by that user (os.TempDir() is,
// /root is not), or Ensure returns an error saying which directory is not.
//
// # Test cluster
//
// TestDataDir and TestClusterConfig name the cluster that the tests of this module
// share; the command pgtestctl stops it at the end of a CI run.
package pgcluster
