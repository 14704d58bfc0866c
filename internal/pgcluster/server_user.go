package pgcluster

import (
	"fmt"
	"log/slog"
	"os"
	"os/user"
	"path/filepath"
	"strconv"
	"syscall"
)

// unprivilegedUser is the account that runs initdb, pg_ctl and the server when this
// process runs as root.
const unprivilegedUser = "nobody"

// serverUser is the account that owns the data directory and runs the server.
type serverUser struct {
	name string
	uid  uint32
	gid  uint32
	// cred is nil when the programs run as this process's own user.
	cred *syscall.Credential
}

// lookupServerUser returns the current user, or unprivilegedUser when running as root.
func lookupServerUser() (*serverUser, error) {
	if os.Geteuid() != 0 {
		return &serverUser{name: "current user", uid: uint32(os.Geteuid()), gid: uint32(os.Getegid())}, nil
	}
	u, err := user.Lookup(unprivilegedUser)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: running as root, and initdb refuses root: look up user %q to run it: %w", unprivilegedUser, err)
	}
	uid, err := strconv.ParseUint(u.Uid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: uid of user %q: %w", unprivilegedUser, err)
	}
	gid, err := strconv.ParseUint(u.Gid, 10, 32)
	if err != nil {
		return nil, fmt.Errorf("pgcluster: gid of user %q: %w", unprivilegedUser, err)
	}
	return &serverUser{
		name: unprivilegedUser,
		uid:  uint32(uid),
		gid:  uint32(gid),
		// Groups is empty: the programs lose root's supplementary groups.
		cred: &syscall.Credential{Uid: uint32(uid), Gid: uint32(gid)},
	}, nil
}

// chown gives path to the user when the programs run as another user than this process.
func (u *serverUser) chown(path string) error {
	if u.cred == nil {
		return nil
	}
	if err := os.Lchown(path, int(u.uid), int(u.gid)); err != nil {
		return fmt.Errorf("pgcluster: give %s to user %s: %w", path, u.name, err)
	}
	return nil
}

// checkReachable returns an error naming the first parent of dir that the user cannot
// search, since the server could not reach its data directory through it. Only mode bits
// are checked (no ACLs); it matters when running as root, which may search anything.
// With open, it adds the search bit for others to such a parent instead.
func (u *serverUser) checkReachable(dir string, open bool, logger *slog.Logger) error {
	if u.cred == nil {
		return nil
	}
	for d := filepath.Dir(dir); ; d = filepath.Dir(d) {
		fi, err := os.Stat(d)
		if err != nil {
			return fmt.Errorf("pgcluster: check that %s can reach the data directory: %w", u.name, err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			return nil // not a Unix file system: let initdb report any problem
		}
		var bit os.FileMode
		switch {
		case st.Uid == u.uid:
			bit = 0o100
		case st.Gid == u.gid:
			bit = 0o010
		default:
			bit = 0o001
		}
		if fi.Mode().Perm()&bit == 0 && open {
			if err := os.Chmod(d, fi.Mode().Perm()|0o001); err != nil {
				return fmt.Errorf("pgcluster: let %s reach the data directory: %w", u.name, err)
			}
			logger.Info("added search permission for others so that the PostgreSQL server user can reach its data directory",
				slog.String("dir", d), slog.String("user", u.name))
		} else if fi.Mode().Perm()&bit == 0 {
			return fmt.Errorf("pgcluster: data directory %s is not reachable by user %s (uid %d), which runs PostgreSQL because this process runs as root: %s (mode %s) is not searchable by it; use a directory under %s",
				dir, u.name, u.uid, d, fi.Mode().Perm(), os.TempDir())
		}
		if d == filepath.Dir(d) {
			return nil
		}
	}
}
