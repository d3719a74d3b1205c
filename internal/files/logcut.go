package files

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"time"
)

// CutLog bounds the log at path, which its writers keep open in append
// mode (a process's standard output, a child's): once it is larger than
// max, its last max bytes are copied to path.1 (replacing the one before)
// and path is truncated, and the writers go on at its new end. Renaming
// would not do: a writer's open file would follow the renamed one. Lines
// written between the copy and the truncation are lost, a few at most. It
// reports whether it cut.
func CutLog(path string, max int64) (bool, error) {
	fi, err := os.Stat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	if fi.Size() <= max {
		return false, nil
	}
	src, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer src.Close()
	size := fi.Size()
	if _, err := src.Seek(size-max, io.SeekStart); err != nil {
		return false, err
	}
	tmp := path + ".1.tmp"
	dst, err := os.OpenFile(tmp, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return false, err
	}
	_, err = io.Copy(dst, io.LimitReader(src, max))
	if cerr := dst.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path+".1")
	}
	if err != nil {
		_ = os.Remove(tmp)
		return false, fmt.Errorf("keeping the end of log %s: %w", path, err)
	}
	if err := os.Truncate(path, 0); err != nil {
		return false, fmt.Errorf("cutting log %s: %w", path, err)
	}
	return true, nil
}

// KeepLogs cuts the logs paths names (see CutLog) every period until ctx
// ends: each then takes at most 2*max on disk, plus what is written to it
// in one period. A log that cannot be cut is reported to failed and tried
// again next time.
func KeepLogs(ctx context.Context, period time.Duration, max int64, paths func() []string, failed func(path string, err error)) {
	tick := time.NewTicker(period)
	defer tick.Stop()
	for {
		for _, p := range paths() {
			if _, err := CutLog(p, max); err != nil && failed != nil {
				failed(p, err)
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}
