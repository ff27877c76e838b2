package main

import (
	"github.com/spf13/cobra"
)

// addBuiltinExamples gives cobra's own commands (help, completion and its shells) an example,
// as every edgeflow command has one.
func addBuiltinExamples(root *cobra.Command) {
	root.InitDefaultHelpCmd()
	root.InitDefaultCompletionCmd()
	for _, c := range root.Commands() {
		switch c.Name() {
		case "help":
			c.Example = "  edgeflow help serve"
		case "completion":
			c.Example = "  source <(edgeflow completion bash)\n  edgeflow completion bash > /etc/bash_completion.d/edgeflow"
			for _, sh := range c.Commands() {
				switch sh.Name() {
				case "bash":
					sh.Example = "  source <(edgeflow completion bash)\n  edgeflow completion bash > /etc/bash_completion.d/edgeflow"
				case "zsh":
					sh.Example = "  edgeflow completion zsh > \"${fpath[1]}/_edgeflow\""
				case "fish":
					sh.Example = "  edgeflow completion fish > ~/.config/fish/completions/edgeflow.fish"
				case "powershell":
					sh.Example = "  edgeflow completion powershell | Out-String | Invoke-Expression"
				}
			}
		}
	}
}
