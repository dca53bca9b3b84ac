"""emmy.cuda_templates: jinja2 templates and the CUDA runtime header (package data)."""
