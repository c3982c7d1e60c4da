import io

from rich.console import Console

from rlrobot.logging.tables import print_table

ROWS = [("study-experts-contacts-0.005-nofloor", "study", "a long description that has to wrap somewhere on a narrow terminal")]


def test_piped_output_is_one_tab_separated_line_per_row_with_whole_values():
    out = io.StringIO()
    print_table(Console(file=out), "entries", ("name", "group", "what"), ROWS)
    lines = out.getvalue().splitlines()
    assert lines == ["# entries", "name\tgroup\twhat", "\t".join(ROWS[0])]


def test_a_narrow_terminal_wraps_other_columns_but_never_cuts_an_identifier():
    out = io.StringIO()
    print_table(Console(file=out, force_terminal=True, width=60, color_system=None), "entries", ("name", "group", "what"), ROWS)
    text = out.getvalue()
    assert "study-experts-contacts-0.005-nofloor" in text
    assert "…" not in text
    assert "".join(text.split()).count("somewhere") == 1  # wrapped, every word still there
