//go:build unix

package envoyrls

import (
	"os"
	"syscall"
)

// fileID is the device and inode of a file: a file replaced by another of
// the same size and time still changes it.
func fileID(fi os.FileInfo) [2]uint64 {
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		return [2]uint64{uint64(st.Dev), st.Ino}
	}
	return [2]uint64{}
}
