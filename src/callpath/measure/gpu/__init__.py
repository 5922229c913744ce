"""GPU measurement (``callpath run -e gpu=nvidia``): CUPTI library, its build, conversion."""
