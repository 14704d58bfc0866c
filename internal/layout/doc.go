// Package layout holds, as tests, the rules of the repository's layout that
// the code keeps: which package may import which.
package layout
