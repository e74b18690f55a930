#!/bin/bash
pwd > where.txt; echo "$TASK_GREETING" > greeting.txt
units -t '2 hours' minutes > answer.txt
