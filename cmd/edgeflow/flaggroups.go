package main

import (
	"strings"
	"unicode"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// Flag groups: a command with many flags lists them in sections, in --help and in the CLI
// reference (docs.go). A flag's section is its annotation flagGroupAnnotation; the command's
// annotation flagGroupsAnnotation orders the sections. Flags in no section come first, under
// "Flags", as cobra prints them.
const (
	flagGroupAnnotation  = "edgeflow_flag_group"
	flagGroupsAnnotation = "edgeflow_flag_groups"
)

func init() {
	cobra.AddTemplateFunc("flagSections", flagSectionsUsage)
}

// usageTemplate is cobra's default usage template with the local flags printed by section.
func usageTemplate(root *cobra.Command) string {
	const flags = "Flags:\n{{.LocalFlags.FlagUsages | trimTrailingWhitespaces}}"
	t := root.UsageTemplate()
	if !strings.Contains(t, flags) {
		panic("cobra's usage template no longer lists the local flags as edgeflow expects")
	}
	return strings.Replace(t, flags, "{{flagSections .}}", 1)
}

// groupFlags puts each flag of cmd under the first section whose test accepts its name; the
// sections are listed in the order given.
func groupFlags(cmd *cobra.Command, sections []flagSectionRule) {
	titles := make([]string, len(sections))
	for i, s := range sections {
		titles[i] = s.title
	}
	if cmd.Annotations == nil {
		cmd.Annotations = map[string]string{}
	}
	cmd.Annotations[flagGroupsAnnotation] = strings.Join(titles, "\n")
	cmd.Flags().VisitAll(func(f *pflag.Flag) {
		for _, s := range sections {
			if s.match(f.Name) {
				_ = cmd.Flags().SetAnnotation(f.Name, flagGroupAnnotation, []string{s.title})
				return
			}
		}
	})
}

// flagSectionRule is a section of flags: its title and which flag names it takes.
type flagSectionRule struct {
	title string
	match func(name string) bool
}

// flagGroupSection is one section's flags.
type flagGroupSection struct {
	title string
	flags *pflag.FlagSet
}

// flagSections splits fs (flags of cmd) into its sections: the ungrouped ones first, as
// "Flags", then each section in the command's order; empty sections are left out.
func flagSections(cmd *cobra.Command, fs *pflag.FlagSet) []flagGroupSection {
	titles := []string{"Flags"}
	if order := cmd.Annotations[flagGroupsAnnotation]; order != "" {
		titles = append(titles, strings.Split(order, "\n")...)
	}
	sets := map[string]*pflag.FlagSet{}
	fs.VisitAll(func(f *pflag.Flag) {
		title := "Flags"
		if g := f.Annotations[flagGroupAnnotation]; len(g) == 1 {
			title = g[0]
		}
		if sets[title] == nil {
			sets[title] = pflag.NewFlagSet(title, pflag.ContinueOnError)
			sets[title].SortFlags = fs.SortFlags
		}
		sets[title].AddFlag(f)
	})
	var out []flagGroupSection
	for _, t := range titles {
		if s := sets[t]; s != nil && s.HasAvailableFlags() {
			out = append(out, flagGroupSection{title: t, flags: s})
		}
	}
	return out
}

// flagSectionsUsage is the usage template's local flags: each section's title and flags.
func flagSectionsUsage(cmd *cobra.Command) string {
	var parts []string
	for _, s := range flagSections(cmd, cmd.LocalFlags()) {
		parts = append(parts, s.title+":\n"+strings.TrimRightFunc(s.flags.FlagUsages(), unicode.IsSpace))
	}
	return strings.Join(parts, "\n\n")
}
