// Package layout holds, as tests, the rules of the repository's layout that
// the code keeps: which package may import which, and that every module file
// requires the library's dependencies at the versions of its go.mod.
package layout
