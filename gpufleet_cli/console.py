"""The one rich Console the command prints tables with."""

import rich.console


class Console(rich.console.Console):
    """rich's Console, except that a reader who went away (`gpufleet report | head -3`) ends the command as a
    closed pipe ends any other one: rich's own handler exits 1, which this command's exit codes read as WARN.
    main() turns the BrokenPipeError into exit 141, as a tool killed by SIGPIPE reports."""

    def on_broken_pipe(self):
        self.quiet = True
        raise BrokenPipeError()
