package reproduce

import (
	"encoding/gob"
	"fmt"
	"os"
	"path/filepath"
)

// SaveOutcome writes everything a run measured, every latency included, to path (gob), so that
// the report can be written again from it (RenderReport) without running the experiment again.
// It writes a temporary file beside path and renames it, so path is never half-written.
func SaveOutcome(o *Outcome, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	f, err := os.CreateTemp(filepath.Dir(path), filepath.Base(path)+".*")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name()) // after the rename, a no-op
	if err := gob.NewEncoder(f).Encode(o); err != nil {
		f.Close()
		return fmt.Errorf("save outcome: %w", err)
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), path)
}

// LoadOutcome reads what SaveOutcome wrote.
func LoadOutcome(path string) (*Outcome, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var o Outcome
	if err := gob.NewDecoder(f).Decode(&o); err != nil {
		return nil, fmt.Errorf("%s: not a saved outcome: %w", path, err)
	}
	return &o, nil
}
