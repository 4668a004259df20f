"""Exceptions raised by the gradient codes."""


class NotDecodable(Exception):
    """The responders cannot recover the gradient sum: there is no decoding
    vector a, supported on the responders I, with a_I B_I = 1_{1 x n}.

    For binary class codes this means no recovery partition (class, or one
    worker per block for FRC/GFRC) is complete among the responders; for real
    and complex codes it means the least-squares residual ||a_I B_I - 1||_2 is
    above the tolerance (in practice: fewer than n - s responders).
    """
