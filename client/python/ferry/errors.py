"""ferry's exception type."""


class FerryError(RuntimeError):
    """An error from ferryd or the ferry client library.

    Attributes:
      code: the status code name ("NOT_FOUND", "UNAVAILABLE", ...), as in absl/gRPC.
      message: what went wrong and, where possible, what to do.
      code_value: the numeric code (0-16), or None when the error arose in Python.
      reason: a machine-readable reason for the failures a client acts on ("RANK_HELD":
        the rank is consumed by a live process), else "". Code acts on it, never on the
        message's text.
    """

    def __init__(self, code, message, code_value=None, reason=""):
        super().__init__("%s: %s" % (code, message))
        self.code = code
        self.message = message
        self.code_value = code_value
        self.reason = reason
