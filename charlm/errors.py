"""UserError: the base of every error the user can fix (a bad setting, file, checkpoint or run). The command
line prints one as its one line and exits 1; anything else is charlm's fault and says so. A new kind of user
error subclasses it, and nothing else has to list it."""


class UserError(Exception):
    pass


class ConfigError(UserError, ValueError):
    """A setting that cannot work, with a message that says what to change."""


class CheckpointError(UserError):
    """A checkpoint that cannot be used, with a message that says why."""
